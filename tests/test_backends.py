"""Vector backends follow one contract: the same seeded env gives the same steps on each."""

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.envs import EnvError, SyncVecEnv, make_vec_env
from corral.envs.subproc import SubprocVecEnv

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import envpool  # noqa: F401

    HAVE_ENVPOOL = True
except ImportError:
    HAVE_ENVPOOL = False
needs_envpool = pytest.mark.skipif(not HAVE_ENVPOOL, reason="envpool is not installed (pip install 'corral[envpool]')")


def trajectory(env, actions, seed=3):
    """Everything a consumer can see over a run, as a flat list of tensors."""
    out = [env.reset(seed=seed)]
    for a in actions:
        obs, rew, term, trunc, info = env.step(a)
        done = info["episode_done"]
        out += [obs, rew, term, trunc, info["final_obs"], done,
                torch.where(done, info["episode_return"], 0.0), torch.where(done, info["episode_length"], 0)]
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, f"item {i}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        assert torch.equal(x, y), f"item {i} differs"


def random_actions(space, n, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(0, int(space.n), (steps, n), generator=g)
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    return low + (high - low) * torch.rand(steps, n, *space.shape, generator=g)


@pytest.mark.parametrize("env_id,kwargs", [("CartPole-v1", {"max_episode_steps": 25}), ("Pendulum-v1", {"max_episode_steps": 30})])
def test_subproc_steps_exactly_like_sync(env_id, kwargs):
    sync = make_vec_env(env_id, 5, kwargs)
    actions = random_actions(sync.single_action_space, 5, 120)
    expected = trajectory(sync, actions)
    with make_vec_env(env_id, 5, kwargs, backend="subproc", num_workers=2) as sub:  # slices of 3 and 2
        assert sub.num_workers == 2 and sub.slices == [(0, 3), (3, 2)]
        assert sub.single_observation_space == sync.single_observation_space
        got = trajectory(sub, actions)
    assert_same(expected, got)
    assert sum(t.any().item() for t in expected[4::8]) > 0  # truncations happened and were compared


def test_subproc_builds_user_envs_from_specs_factories_and_instances():
    from envs_for_tests import CountEnv

    specs = ["envs_for_tests:make_count_env", f"{HERE}/envs_for_tests.py:CountEnv", CountEnv, CountEnv(length=5)]
    for spec in specs:
        with make_vec_env(spec, 3, backend="subproc", num_workers=2) as env:
            env.reset()
            for _ in range(4):
                env.step(torch.zeros(3, dtype=torch.long))
            _, _, term, _, info = env.step(torch.zeros(3, dtype=torch.long))
            assert term.all() and info["episode_length"].tolist() == [5, 5, 5]
    # a lambda closing over a local value travels by cloudpickle
    length = 2
    with SubprocVecEnv(lambda: CountEnv(length=length), 2, num_workers=2) as env:
        env.reset()
        env.step(torch.zeros(2, dtype=torch.long))
        _, _, term, _, _ = env.step(torch.zeros(2, dtype=torch.long))
        assert term.all()


def test_spawned_workers_resolve_a_file_spec_themselves():
    # spawn: nothing is inherited, the worker imports the file from the spec string
    factory = __import__("corral.envs.make", fromlist=["make_factory"]).make_factory(
        f"{HERE}/envs_for_tests.py:CountEnv", {"length": 3}
    )
    with SubprocVecEnv(factory, 1, start_method="spawn") as env:
        assert env.reset().tolist() == [[0.0]]
        for _ in range(2):
            env.step(torch.zeros(1, dtype=torch.long))
        _, _, term, _, info = env.step(torch.zeros(1, dtype=torch.long))
        assert term.item() and info["episode_return"].item() == 3.0


def test_subproc_state_dict_moves_between_backends_bit_for_bit():
    sub = make_vec_env("Pendulum-v1", 3, backend="subproc", num_workers=2)
    sub.reset(seed=1)
    for a in random_actions(sub.single_action_space, 3, 7):
        sub.step(a)
    state = sub.state_dict()
    assert state["copyable"] and len(state["envs"]) == 3
    sync = make_vec_env("Pendulum-v1", 3)
    sync.reset(seed=99)
    assert sync.load_state_dict(state)
    actions = random_actions(sub.single_action_space, 3, 230, seed=1)  # crosses the 200-step time limit
    try:
        for a in actions:
            ra, rb = sub.step(a), sync.step(a)
            assert torch.equal(ra[0], rb[0]) and torch.equal(ra[1], rb[1]) and torch.equal(ra[3], rb[3])
        # and back: the sync state loads into a fresh subproc env
        other = make_vec_env("Pendulum-v1", 3, backend="subproc", num_workers=3)
        other.reset(seed=5)
        assert other.load_state_dict(sync.state_dict())
        a = actions[0]
        assert torch.equal(other.step(a)[0], sync.step(a)[0])
        other.close()
    finally:
        sub.close()


def test_an_env_raising_in_a_worker_names_env_index_step_and_keeps_the_cause():
    env = make_vec_env("envs_for_tests:make_count_env", 4, {"length": 10, "bad_step": 2, "bad": "raise"},
                       backend="subproc", num_workers=2)
    try:
        env.reset()
        env.step(torch.zeros(4, dtype=torch.long))
        with pytest.raises(EnvError, match=r"\(index 0\) raised at vector step 1: RuntimeError: simulator exploded") as e:
            env.step(torch.zeros(4, dtype=torch.long))
        assert isinstance(e.value.__cause__, RuntimeError)
    finally:
        env.close()


class ExitEnv(gym.Env):
    """Kills its own process on the second step, like a segfaulting simulator."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 2:
            os._exit(3)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_a_worker_that_dies_is_reported_with_its_envs_and_exit_code():
    env = SubprocVecEnv(ExitEnv, 2, env_id="exit-env", num_workers=2)
    try:
        env.reset()
        env.step(torch.zeros(2, dtype=torch.long))
        with pytest.raises(EnvError, match=r"worker process 0 \(env indices 0..0\) died \(exit code 3\) at vector step 1"):
            env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()


class ExitIfEvenSeed(gym.Env):
    """Its process dies (as in a segfault) at its 2nd step when it was reset with an even seed."""

    observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.doomed = seed is not None and seed % 2 == 0
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 2 and self.doomed:
            os._exit(3)
        return np.full(1, self.t, np.float32), 1.0, False, False, {}


def test_a_worker_that_dies_is_started_again_with_on_error_restart():
    # worker 0 holds env 0 (seed 0: dies), worker 1 env 1 (seed 1: lives)
    env = SubprocVecEnv(ExitIfEvenSeed, 2, env_id="exit-env", num_workers=2, on_error="restart", max_restarts=1)
    try:
        env.reset(seed=0)
        one = torch.ones(2, dtype=torch.long)
        last, *_ = env.step(one)
        with pytest.warns(UserWarning, match=r"worker process 0 \(env indices 0..0\) died \(exit code 3\) at vector "
                                             r"step 1; started a new one and dropped the unfinished episodes of its 1 envs"):
            obs, rew, term, trunc, info = env.step(one)
        assert env.restarts == 1
        assert trunc.tolist() == [True, False] and term.tolist() == [False, False]
        assert rew.tolist() == [0.0, 1.0]  # the dead env's step earned nothing; the other went on
        assert obs.flatten().tolist() == [0.0, 2.0]  # a fresh episode in the new process
        assert torch.equal(info["final_obs"][0], last[0])  # the broken episode's last observation
        assert info["episode_done"].tolist() == [False, False]  # and it is not reported as finished
        obs, rew, *_ = env.step(one)  # the new process steps its fresh episode
        assert obs.flatten().tolist() == [1.0, 3.0] and rew.tolist() == [1.0, 1.0]
    finally:
        env.close()


def test_a_worker_that_keeps_dying_gives_up_after_max_restarts():
    env = SubprocVecEnv(ExitEnv, 2, env_id="exit-env", num_workers=2, on_error="restart", max_restarts=1)
    try:
        env.reset()
        zero = torch.zeros(2, dtype=torch.long)
        env.step(zero)
        with pytest.warns(UserWarning, match="started a new one"):
            env.step(zero)  # both die at their 2nd step; both come back
        env.step(zero)
        with pytest.raises(EnvError, match=r"died \(exit code 3\) at vector step 3; giving up after 1 restarts"):
            env.step(zero)
    finally:
        env.close()


def test_closing_ends_the_workers():
    env = make_vec_env("CartPole-v1", 2, backend="subproc", num_workers=2)
    procs = list(env._procs)
    env.close()
    env.close()  # twice is fine
    assert not any(p.is_alive() for p in procs)


@needs_envpool
@pytest.mark.filterwarnings("ignore:.*precision lowered")
def test_envpool_resets_in_the_same_step_like_every_backend():
    """Each env of a corral EnvPool env against a one-env EnvPool pool driven by hand:
    EnvPool resets on the step after an episode ends; corral folds that step into the
    step that ended it, keeping the final observation apart."""
    import envpool

    n, steps, seed = 3, 80, 7
    env = make_vec_env("CartPole-v1", n, {"max_episode_steps": 20}, backend="envpool")
    actions = random_actions(env.single_action_space, n, steps)
    got = trajectory(env, actions, seed=seed)
    env.close()
    for i in range(n):  # EnvPool seeds env i with seed + i
        ref = envpool.make_gymnasium("CartPole-v1", num_envs=1, seed=seed + i, max_episode_steps=20)
        obs, _ = ref.reset()
        assert np.array_equal(got[0][i].numpy(), obs[0])
        ret, length = 0.0, 0
        for t in range(steps):
            o, r, te, tr, _ = ref.step(actions[t, i : i + 1].numpy())
            ret += float(r[0])
            length += 1
            final = o[0]
            if te[0] or tr[0]:
                o, *_ = ref.step(np.zeros(1, dtype=np.int64))  # EnvPool's reset step
            b = 1 + 8 * t
            obs_t, rew_t, term_t, trunc_t, final_t, done_t, ret_t, len_t = (x[i] for x in got[b : b + 8])
            assert np.array_equal(obs_t.numpy(), o[0].astype(np.float32)), (i, t)
            assert np.array_equal(final_t.numpy(), final.astype(np.float32))
            assert rew_t.item() == r[0] and term_t.item() == te[0] and trunc_t.item() == tr[0]
            assert done_t.item() == bool(te[0] or tr[0])
            if done_t:
                assert ret_t.item() == np.float32(ret) and len_t.item() == length
                ret, length = 0.0, 0


@needs_envpool
def test_envpool_checks_actions_and_reports_unknown_ids():
    from corral.errors import UserError

    env = make_vec_env("CartPole-v1", 2, backend="envpool")
    env.reset(seed=0)
    with pytest.raises(EnvError, match="outside Discrete"):
        env.step(torch.tensor([0, 2]))
    env.close()
    with pytest.raises(UserError, match="EnvPool has no env 'CartPol-v1'; did you mean CartPole-v1"):
        make_vec_env("CartPol-v1", 1, backend="envpool")


def test_unknown_backend_lists_the_choices():
    from corral.errors import UserError

    with pytest.raises(UserError, match="choose one of: sync, subproc, envpool, native"):
        make_vec_env("CartPole-v1", 1, backend="threads")


def test_sync_vec_env_still_takes_a_list_of_factories():
    env = SyncVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    assert env.reset(seed=0).shape == (2, 4) and env.envs[0] is not env.envs[1]
