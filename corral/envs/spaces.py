"""Dict and Tuple observations as one flat float32 vector plus a layout.

corral's storage and networks take one observation tensor. An env whose
observation space is a ``Dict`` or ``Tuple`` is wrapped so each observation is the
concatenation of its parts (``gymnasium.spaces.flatten`` per part: Discrete parts
one-hot, images flattened), and the new ``Box`` carries ``corral_layout``: one
``Part(key, shape, dtype, start, stop, image)`` per part. Actors read the layout to
send image parts through a CNN and to find an ``action_mask`` part.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np


class Part(NamedTuple):
    key: str
    shape: tuple[int, ...]
    image: bool
    start: int
    stop: int
    onehot: bool = False  # a Discrete / MultiDiscrete / MultiBinary part (one-hot or 0/1): never normalized


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


class FlattenParts(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        items = list(space.spaces.items()) if isinstance(space, gym.spaces.Dict) else \
            [(str(i), s) for i, s in enumerate(space.spaces)]
        self._keys = [k for k, _ in items]
        self._spaces = [s for _, s in items]
        layout, start = [], 0
        for key, sub in items:
            n = int(gym.spaces.flatdim(sub))
            onehot = isinstance(sub, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
            layout.append(Part(key, tuple(sub.shape or ()), _is_image(sub), start, start + n, onehot))
            start += n
        box = gym.spaces.Box(-np.inf, np.inf, (start,), np.float32)
        box.corral_layout = layout  # travels with the space (pickles with its __dict__)
        self.observation_space = box
        self._dict = isinstance(space, gym.spaces.Dict)

    def observation(self, obs: Any) -> np.ndarray:
        parts = [obs[k] for k in self._keys] if self._dict else list(obs)
        return np.concatenate([np.asarray(gym.spaces.flatten(s, p), dtype=np.float32).reshape(-1)
                               for s, p in zip(self._spaces, parts)])


def flatten_parts(env: gym.Env) -> gym.Env:
    """Wrap Dict/Tuple observation envs; leave every other env as it is."""
    if isinstance(env.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return FlattenParts(env)
    return env


def layout_of(space: gym.Space) -> list[Part] | None:
    return getattr(space, "corral_layout", None)


def declare_frame_stack(space: gym.Space, k: int) -> gym.Space:
    """Mark ``space`` as a stack of the env's last ``k`` frames on its first axis (what
    corral's Atari envs produce), so replay stores each frame once. Returns ``space``."""
    space.corral_frame_stack = int(k)  # travels with the space (pickles with its __dict__)
    return space


def frame_stack_of(space: gym.Space) -> int:
    """Frames an observation of ``space`` stacks on its first axis, as its env declared (1: none)."""
    return int(getattr(space, "corral_frame_stack", 1))
