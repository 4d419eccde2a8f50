"""Partially observed versions of classic tasks: the velocities masked out.

``CartPoleNoVel-v1`` and ``PendulumNoVel-v1`` (rl-baselines3-zoo's names), and the same
for MountainCar, Acrobot and LunarLander, are registered with Gymnasium when corral is
imported: the task is unchanged, but the observation entries that are velocities read 0
(the shape stays, as rl-zoo's ``MaskVelocityWrapper`` keeps it), so a policy has to infer
them from the history: a memoryless policy cannot. Any Box-observation env gets the same
masking from the ``env.mask_obs`` option (the indices to zero); ``native:CartPoleNoVel-v1``
is the torch-batched one.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from corral.errors import UserError

# the velocity entries of each task's observation: (masked id, base id, indices)
VELOCITY_DIMS: dict[str, tuple[str, tuple[int, ...]]] = {
    "CartPoleNoVel-v1": ("CartPole-v1", (1, 3)),  # x_dot, theta_dot
    "PendulumNoVel-v1": ("Pendulum-v1", (2,)),  # theta_dot
    "MountainCarNoVel-v0": ("MountainCar-v0", (1,)),
    "MountainCarContinuousNoVel-v0": ("MountainCarContinuous-v0", (1,)),
    "AcrobotNoVel-v1": ("Acrobot-v1", (4, 5)),  # the two angular velocities
    "LunarLanderNoVel-v3": ("LunarLander-v3", (2, 3, 5)),  # vx, vy, angular velocity
    "LunarLanderContinuousNoVel-v3": ("LunarLanderContinuous-v3", (2, 3, 5)),
}


class MaskObservation(gym.ObservationWrapper):
    """Zero the observation entries ``indices`` (of the flattened Box observation)."""

    def __init__(self, env: gym.Env, indices: Sequence[int]):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise UserError(f"env.mask_obs masks entries of a Box observation; this env's is {space}: leave it unset")
        size = int(np.prod(space.shape))
        idx = [int(i) for i in indices]
        bad = [i for i in idx if not -size <= i < size]
        if bad:
            raise UserError(f"env.mask_obs: index {bad[0]} is out of range for an observation of {size} entries "
                            f"(shape {space.shape}); use indices 0..{size - 1}")
        self.mask = np.ones(size, dtype=space.dtype)
        self.mask[idx] = 0
        self.mask = self.mask.reshape(space.shape)  # the space stays the task's (as rl-zoo's does)

    def observation(self, obs):
        return obs * self.mask


def make_masked(base_id: str, indices: Sequence[int], **kwargs) -> gym.Env:
    """The base task's env class (no time limit: the registration adds it), masked."""
    spec = gym.spec(base_id)
    creator = gym.envs.registration.load_env_creator(spec.entry_point)
    return MaskObservation(creator(**{**spec.kwargs, **kwargs}), indices)


class MaskedFactory:
    """A picklable env factory whose envs have ``indices`` masked (``env.mask_obs``)."""

    def __init__(self, factory, indices: Sequence[int]):
        self.factory, self.indices = factory, tuple(int(i) for i in indices)
        self.max_episode_steps = getattr(factory, "max_episode_steps", None)

    def __call__(self) -> gym.Env:
        return MaskObservation(self.factory(), self.indices)


def register_masked() -> None:
    for name, (base, dims) in VELOCITY_DIMS.items():
        if name not in gym.registry and base in gym.registry:
            gym.register(name, entry_point=make_masked, max_episode_steps=gym.spec(base).max_episode_steps,
                         reward_threshold=gym.spec(base).reward_threshold,
                         kwargs={"base_id": base, "indices": dims})
