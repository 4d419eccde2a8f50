"""Checks at the env boundary: actions (shape, dtype, bounds) and envs that misbehave."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.envs import EnvError, SyncVecEnv, make_vec_env
from corral.errors import UserError

BACKENDS = ["sync", "subproc"]


def backend_env(backend, spec, n, kwargs=None, **kw):
    if backend == "subproc":
        kw.setdefault("num_workers", 2)
    return make_vec_env(spec, n, kwargs, backend=backend, **kw)


# --- actions


@pytest.mark.parametrize("backend", BACKENDS)  # actions as numpy scalars / as one array
@pytest.mark.parametrize("bad", [2, -1])
def test_discrete_action_outside_the_space_is_rejected(bad, backend):
    env = make_vec_env("CartPole-v1", 3, backend=backend)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=rf"action {bad} for env index 1 is outside Discrete\(2\) \(valid: 0 .. 1\)"):
        env.step(torch.tensor([0, bad, 1]))
    with pytest.raises(EnvError, match="outside Discrete"):  # the [N, 1] shape is checked the same
        env.step(torch.tensor([[0], [bad], [1]]))


def test_discrete_space_with_a_start_checks_its_own_range():
    class Shifted(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(3, start=-1)

        def reset(self, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            return np.array([action], np.float32), 0.0, False, False, {}

    env = make_vec_env(Shifted, 2)
    env.reset()
    obs, *_ = env.step(torch.tensor([-1, 1]))
    assert obs.flatten().tolist() == [-1.0, 1.0]
    with pytest.raises(EnvError, match=r"action 2 for env index 0 .*valid: -1 .. 1"):
        env.step(torch.tensor([2, 0]))


def test_float_actions_for_a_discrete_space_are_rejected():
    env = make_vec_env("CartPole-v1", 2)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"must be integers, got torch.float32; cast them with .long\(\)"):
        env.step(torch.zeros(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_bounds_box_actions_are_clipped_and_counted(backend):
    env = backend_env(backend, "Pendulum-v1", 3)
    ref = make_vec_env("Pendulum-v1", 3)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)
        action = torch.tensor([[5.0], [0.5], [-3.0]])
        with pytest.warns(UserWarning, match=r"action \[5.0\] for env index 0 is outside .*clipping it"):
            obs, *_ = env.step(action)
        assert env.out_of_bounds_actions == 2
        expected, *_ = ref.step(torch.tensor([[2.0], [0.5], [-2.0]]))
        assert torch.equal(obs, expected)
        env.step(action)  # counted again, warned once
        assert env.out_of_bounds_actions == 4
        assert action[0, 0] == 5.0  # the caller's tensor is left alone
    finally:
        env.close()


def test_strict_rejects_out_of_bounds_box_actions():
    env = make_vec_env("Pendulum-v1", 2, strict=True)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"action \[-2.5\] for env index 1 is outside .*strict=True"):
        env.step(torch.tensor([[0.0], [-2.5]]))
    assert env.out_of_bounds_actions == 0


def test_non_finite_box_actions_are_always_rejected():
    env = make_vec_env("Pendulum-v1", 2)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"action for env index 1 is not finite: \[nan\]"):
        env.step(torch.tensor([[0.0], [float("nan")]]))


def test_actions_from_a_graph_or_numpy_are_accepted():
    env = make_vec_env("Pendulum-v1", 2)
    env.reset(seed=0)
    env.step(torch.zeros(2, 1, requires_grad=True))
    env.step(np.zeros((2, 1), np.float32))
    assert env.out_of_bounds_actions == 0


# --- envs that misbehave


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.filterwarnings("ignore:.*index 1.*rebuilt")
def test_a_crashing_env_is_restarted_and_its_episode_dropped(backend):
    # env 1 raises at its 3rd step; with on_error="restart" it is rebuilt and the run goes on
    env = backend_env(backend, "envs_for_tests:make_count_env", 2, {"length": 4, "bad_step": 3, "bad": "raise"},
                      on_error="restart")
    try:
        env.reset(seed=0)
        zero = torch.zeros(2, dtype=torch.long)
        env.step(zero)
        last, *_ = env.step(zero)
        assert last.flatten().tolist() == [2.0, 2.0]
        with pytest.warns(UserWarning, match=r"\(index 0\) raised at vector step 2: RuntimeError: simulator exploded; rebuilt"):
            obs, rew, term, trunc, info = env.step(zero)
        assert env.restarts == 2  # both envs hit their bad step together
        assert trunc.tolist() == [True, True] and term.tolist() == [False, False]
        assert rew.tolist() == [0.0, 0.0]
        assert info["episode_done"].tolist() == [False, False]  # the broken episodes are not reported
        assert torch.equal(info["final_obs"], last)  # the last observation the broken episode gave
        assert obs.flatten().tolist() == [0.0, 0.0]  # fresh envs
        finished = []
        with pytest.warns(UserWarning, match="restart"):
            for _ in range(6):
                *_, info = env.step(zero)
                finished += info["episode_length"][info["episode_done"]].tolist()
        assert finished == []  # the rebuilt envs crash at step 3 again...
        assert env.restarts == 6  # ...and are rebuilt each time
    finally:
        env.close()


def test_restarts_give_up_after_max_restarts():
    env = SyncVecEnv([lambda: __import__("envs_for_tests").CountEnv(length=9, bad_step=1, bad="raise")],
                     on_error="restart", max_restarts=2)
    env.reset()
    zero = torch.zeros(1, dtype=torch.long)
    with pytest.warns(UserWarning):
        env.step(zero)
        env.step(zero)
        with pytest.raises(EnvError, match="giving up after 2 restarts of this env"):
            env.step(zero)


def test_episodes_after_a_restart_are_reported_again():
    from envs_for_tests import CountEnv

    built = []

    def factory():
        built.append(1)
        # only the first env ever built crashes
        return CountEnv(length=3, bad_step=2 if len(built) == 1 else -1, bad="raise")

    env = SyncVecEnv([factory], on_error="restart")
    env.reset(seed=4)
    zero = torch.zeros(1, dtype=torch.long)
    with pytest.warns(UserWarning, match="restart 1 of this env"):
        env.step(zero)
        _, _, _, trunc, info = env.step(zero)
    assert trunc.item() and not info["episode_done"].item()
    lengths = []
    for _ in range(6):
        *_, info = env.step(zero)
        lengths += info["episode_length"][info["episode_done"]].tolist()
    assert lengths == [3, 3] and env.restarts == 1


def test_an_env_raising_in_its_autoreset_is_named():
    class BadReset(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)
        resets = 0

        def reset(self, seed=None, options=None):
            self.resets += 1
            if self.resets > 1:
                raise ValueError("no more episodes")
            return np.zeros(1, np.float32), {}

        def step(self, action):
            return np.zeros(1, np.float32), 1.0, True, False, {}

    env = make_vec_env(BadReset, 2)
    env.reset()
    with pytest.raises(EnvError, match=r"\(index 0\) raised in reset at vector step 0: ValueError: no more episodes") as e:
        env.step(torch.zeros(2, dtype=torch.long))
    assert isinstance(e.value.__cause__, ValueError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_observation_of_the_wrong_shape_is_named(backend):
    class Wrong(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            return np.zeros(3, np.float32), {}

        def step(self, action):
            return np.zeros(4, np.float32), 0.0, False, False, {}

    env = backend_env(backend, Wrong, 2)
    try:
        env.reset()
        with pytest.raises(EnvError, match=r"observations of shape \(4,\) at vector step 0; its observation space says \(3,\)"):
            env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_values_are_named_on_every_backend(backend):
    env = backend_env(backend, "envs_for_tests:make_count_env", 3, {"length": 10, "bad_step": 2, "bad": "nan_obs"})
    try:
        env.reset()
        env.step(torch.zeros(3, dtype=torch.long))
        with pytest.raises(EnvError, match=r"\(index 0\) returned a non-finite observation at vector step 1"):
            env.step(torch.zeros(3, dtype=torch.long))
    finally:
        env.close()


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="on_error must be 'raise' or 'restart'"):
        make_vec_env("CartPole-v1", 1, on_error="ignore")
    with pytest.raises(UserError, match="num_envs must be >= 1"):
        make_vec_env("CartPole-v1", 0)


class Pick(gym.Env):
    """MultiDiscrete([3, 2]) or MultiBinary(3); the observation echoes the action."""

    def __init__(self, binary: bool = False):
        self.action_space = gym.spaces.MultiBinary(3) if binary else gym.spaces.MultiDiscrete([3, 2])
        n = 3 if binary else 2
        self.observation_space = gym.spaces.Box(-9, 9, (n,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        return np.asarray(action, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_discrete_and_multi_binary_actions_are_checked_and_passed_on(backend):
    md = backend_env(backend, Pick, 2)
    mb = backend_env(backend, Pick, 2, {"binary": True})
    try:
        md.reset()
        obs, *_ = md.step(torch.tensor([[2, 1], [0, 0]]))
        assert obs.tolist() == [[2.0, 1.0], [0.0, 0.0]]
        with pytest.raises(EnvError, match=r"action \[0, 2\] for env index 1 is outside MultiDiscrete"):
            md.step(torch.tensor([[2, 1], [0, 2]]))
        with pytest.raises(EnvError, match="must be integers"):
            md.step(torch.zeros(2, 2))
        mb.reset()
        obs, *_ = mb.step(torch.tensor([[True, False, True], [False, False, True]]))  # bools are fine here
        assert obs.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
        with pytest.raises(EnvError, match=r"action \[0, 2, 0\] for env index 0 is outside MultiBinary"):
            mb.step(torch.tensor([[0, 2, 0], [1, 1, 1]]))
    finally:
        md.close()
        mb.close()


class _ShapeEnv(gym.Env):
    """Returns observations of ``shape`` for a (3,) space: after ``bad_at`` steps, or only as final obs."""

    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, shape=(1,), final_only=False):
        self.shape, self.final_only = shape, final_only

    def reset(self, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        if self.final_only:
            return np.zeros(self.shape, np.float32), 0.0, True, False, {}
        return np.zeros(self.shape, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("final_only", [False, True])
def test_an_observation_that_would_broadcast_is_refused_not_broadcast(backend, final_only):
    env = backend_env(backend, lambda: _ShapeEnv((1,), final_only), 2)
    try:
        env.reset()
        with pytest.raises(EnvError, match=r"observation(s)? of shape \(1,\) at vector step 0; its observation space says \(3,\)"):
            env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()


def test_scalar_observations_are_stacked():
    class Scalar(gym.Env):
        observation_space = gym.spaces.Box(-10, 10, (), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.t = 0
            return np.float32(0.0), {}

        def step(self, action):
            self.t += 1
            return np.float32(self.t), 1.0, self.t == 2, False, {}

    env = make_vec_env(Scalar, 2)
    assert env.reset().shape == (2,)
    obs, _, _, _, info = env.step(torch.zeros(2, dtype=torch.long))
    assert obs.tolist() == [1.0, 1.0]
    obs, _, term, _, info = env.step(torch.zeros(2, dtype=torch.long))
    assert obs.tolist() == [0.0, 0.0] and info["final_obs"].tolist() == [2.0, 2.0] and term.all()


def test_non_uniform_box_bounds_are_checked_per_component():
    class TwoBounds(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32))

        def reset(self, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.last = np.array(action)
            return np.zeros(1, np.float32), 0.0, False, False, {}

    env = make_vec_env(TwoBounds, 2)
    env.reset()
    env.step(torch.tensor([[0.5, 4.0], [-1.0, 0.0]]))  # in bounds: 4.0 is fine for the second component only
    assert env.out_of_bounds_actions == 0
    with pytest.warns(UserWarning, match="clipping"):
        env.step(torch.tensor([[2.0, 4.0], [0.0, -1.0]]))
    assert env.out_of_bounds_actions == 2
    assert env.envs[0].last.tolist() == [1.0, 4.0] and env.envs[1].last.tolist() == [0.0, 0.0]


def test_python_train_with_a_bad_env_leaves_no_run_directory(tmp_path):
    import corral

    with pytest.raises(UserError, match="NoSuchEnv"):
        corral.train("ppo", "NoSuchEnv-v0", steps=1000, run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
