"""Native torch-batched classic-control envs, checked against Gymnasium itself.

The central test runs K Gymnasium envs and a float64 native batch of K side by side
from the same states with the same actions, and compares every step. Then the
VecEnv contract: time limits, autoreset, episode statistics, checkpoints, seeding,
sizes, devices, bad input.
"""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.envs.base import EnvError, VecEnv
from corral.envs.native import NATIVE_ENVS, make_native

torch.set_num_threads(1)

DEVICES = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
TIME_LIMITS = {
    "CartPole-v1": 500,
    "CartPoleNoVel-v1": 500,
    "Acrobot-v1": 500,
    "MountainCar-v0": 200,
    "MountainCarContinuous-v0": 999,
    "Pendulum-v1": 200,
}
# How long to run each env side by side: past one time limit, long enough for the
# steering policies below to reach the goal / fall many times.
LOCKSTEP_STEPS = {
    "CartPole-v1": 600,
    "CartPoleNoVel-v1": 600,
    "Acrobot-v1": 600,
    "MountainCar-v0": 450,
    "MountainCarContinuous-v0": 1050,
    "Pendulum-v1": 450,
}


# Start states at the edges of the dynamics (speed limits, walls, angle wrapping,
# termination boundaries), given to the first envs of the side-by-side run.
PI = np.pi
EDGE_STATES = {
    "CartPole-v1": [[2.39, 1.0, 0.0, 0.0], [0.0, 0.0, 0.2, 1.0]],
    "CartPoleNoVel-v1": [[2.39, 1.0, 0.0, 0.0], [0.0, 0.0, 0.2, 1.0]],
    "Acrobot-v1": [[PI - 0.01, -PI + 0.01, 4 * PI - 0.1, 9 * PI - 0.1], [0.5, 2.0, -4 * PI + 0.05, -9 * PI + 0.05]],
    "MountainCar-v0": [[-0.5, 0.0699], [-1.19, -0.069]],
    "MountainCarContinuous-v0": [[-0.5, 0.0699], [-1.19, -0.069]],
    "Pendulum-v1": [[PI, 7.99], [-0.1, -8.0]],
}


def random_actions(env, rng: np.random.Generator, n: int) -> np.ndarray:
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, n)
    # 20% past the bounds, so clipping is exercised too.
    return rng.uniform(1.2 * space.low[0], 1.2 * space.high[0], (n, 1)).astype(np.float32)


def steering_actions(env_id: str, obs: np.ndarray) -> np.ndarray | None:
    """Simple controllers that balance the pole / reach the goal, so episodes end both ways."""
    if env_id in ("CartPole-v1", "CartPoleNoVel-v1"):  # (the velocity terms read 0 in NoVel)
        return (3 * obs[:, 2] + obs[:, 3] + 0.1 * obs[:, 0] + 0.3 * obs[:, 1] > 0).astype(np.int64)
    if env_id == "Acrobot-v1":
        return np.where(obs[:, 5] > 0, 2, 0)
    if env_id == "MountainCar-v0":
        return np.where(obs[:, 1] > 0, 2, 0)
    if env_id == "MountainCarContinuous-v0":
        return np.where(obs[:, 1] > 0, 1.0, -1.0).astype(np.float32)[:, None]
    return None


def gym_observation(env_id: str, env: gym.Env) -> np.ndarray:
    """What Gymnasium would return as the observation of its current state."""
    u = env.unwrapped
    if env_id == "Acrobot-v1":
        return u._get_ob()
    if env_id == "Pendulum-v1":
        return u._get_obs()
    if env_id == "CartPoleNoVel-v1":
        return np.array(u.state, dtype=np.float32) * np.array([1, 0, 1, 0], np.float32)
    return np.array(u.state, dtype=np.float32)


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_matches_gymnasium_step_by_step(env_id):
    k, seed = 8, 0
    native = make_native(env_id, k, seed=seed, dtype=torch.float64)
    envs = [gym.make(env_id) for _ in range(k)]
    native.reset(seed=seed)
    start = native.get_state().numpy()
    edges = np.array(EDGE_STATES[env_id])
    start[: len(edges)] = edges
    native.set_state(torch.as_tensor(start))
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
        env.unwrapped.state = start[i].copy()
    obs = torch.as_tensor(np.stack([gym_observation(env_id, env) for env in envs]))
    rng = np.random.default_rng(seed)
    terminations = truncations = 0
    for t in range(LOCKSTEP_STEPS[env_id]):
        actions = random_actions(native, rng, k)
        # (the masked CartPole steers from the true state: its observation has no velocities)
        steer = steering_actions(env_id, native.get_state().numpy() if "NoVel" in env_id else obs.numpy())
        if steer is not None:
            actions[::2] = steer[::2]  # even envs steer, odd envs act at random
        obs, reward, terminated, truncated, info = native.step(torch.as_tensor(actions))
        g_obs, g_reward, g_term, g_trunc, _ = (np.array(x) for x in zip(*(e.step(a) for e, a in zip(envs, actions))))
        where = f"{env_id} step {t}"
        np.testing.assert_array_equal(terminated.numpy(), g_term, err_msg=where)
        np.testing.assert_array_equal(truncated.numpy(), g_trunc, err_msg=where)
        np.testing.assert_allclose(info["final_obs"].numpy(), g_obs, rtol=0, atol=1e-6, err_msg=where)
        np.testing.assert_allclose(reward.numpy(), g_reward.astype(np.float32), rtol=1e-6, atol=0, err_msg=where)
        done = g_term | g_trunc
        terminations += g_term.sum()
        truncations += g_trunc.sum()
        assert torch.equal(obs[~done], info["final_obs"][~done]), where
        fresh = native.get_state().numpy()
        if t % 100 == 99:
            # torch's and Python's float64 ops round differently in the last bit, and a chaotic
            # system grows that to 1e-6 over a few hundred steps (CartPole, with numpy 2.4): both
            # sides go on from the native state, so every step is compared, not the chaos
            for i in np.flatnonzero(~done):
                envs[i].unwrapped.state = fresh[i].copy()
        for i in np.flatnonzero(done):
            # Continue both sides from the native env's new episode.
            envs[i].reset()
            envs[i].unwrapped.state = fresh[i].copy()
            np.testing.assert_allclose(obs[i].numpy(), gym_observation(env_id, envs[i]), rtol=0, atol=1e-6)
    # The run must have covered the ways episodes end in this env.
    assert truncations > 0
    if env_id != "Pendulum-v1":  # Pendulum never terminates
        assert terminations > 0


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_float32_physics_stays_close_to_gymnasium(env_id):
    k = 64
    native = make_native(env_id, k, seed=1)
    envs = [gym.make(env_id) for _ in range(k)]
    rng = np.random.default_rng(1)
    for _ in range(20):  # states met along random trajectories
        native.step(torch.as_tensor(random_actions(native, rng, k)))
    state = native.get_state().numpy()
    actions = random_actions(native, rng, k)
    _, reward, terminated, _, info = native.step(torch.as_tensor(actions))
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.unwrapped.state = state[i].astype(np.float64)
        g_obs, g_reward, g_term, _, _ = env.step(actions[i])
        np.testing.assert_allclose(info["final_obs"][i].numpy(), g_obs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(reward[i].item(), g_reward, rtol=1e-5, atol=1e-5)
        assert bool(terminated[i]) == g_term


def test_spaces_match_gymnasium():
    for env_id in NATIVE_ENVS:
        native, env = make_native(env_id, 2), gym.make(env_id)
        assert native.single_observation_space == env.observation_space, env_id
        assert native.single_action_space == env.action_space, env_id
        assert native.max_episode_steps == env.spec.max_episode_steps == TIME_LIMITS[env_id]


@pytest.mark.parametrize("sparse_reset", [True, False], ids=["cpu_reset", "accelerator_reset"])
@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_truncation_at_the_time_limit_sets_truncated_and_final_obs(env_id, sparse_reset):
    n, limit = 6, TIME_LIMITS[env_id]
    env = make_native(env_id, n, seed=3)
    env._sparse_reset = sparse_reset  # both autoreset paths are checked on CPU
    twin = make_native(env_id, n, seed=4)  # same states, clock far from the limit
    start = env.get_state()
    twin.set_state(start, elapsed_steps=0)
    # Fresh initial states cannot end an episode in one step; only the clock can.
    env.set_state(start, elapsed_steps=torch.tensor([limit - 1, limit - 2, limit - 1, 0, limit - 1, 3]))
    action = torch.as_tensor(random_actions(env, np.random.default_rng(0), n))
    obs, _, terminated, truncated, info = env.step(action)
    twin_obs, *_ = twin.step(action)
    ended = torch.tensor([True, False, True, False, True, False])
    assert truncated.tolist() == ended.tolist()
    assert not terminated.any()
    assert torch.equal(info["final_obs"], twin_obs)  # the true last observation, everywhere
    assert torch.equal(obs[~ended], twin_obs[~ended])
    assert not torch.equal(obs[ended], twin_obs[ended])  # new episodes began
    assert info["episode_length"][ended].tolist() == [limit] * 3
    assert env.elapsed_steps.tolist() == [0, limit - 1, 0, 1, 0, 4]


@pytest.mark.parametrize("sparse_reset", [True, False], ids=["cpu_reset", "accelerator_reset"])
def test_autoreset_starts_the_next_episode_in_the_same_step(sparse_reset):
    n = 256
    env = make_native("CartPole-v1", n, seed=5)
    env._sparse_reset = sparse_reset
    gen = torch.Generator().manual_seed(0)
    seen_done = 0
    for _ in range(60):
        obs, _, terminated, truncated, info = env.step(torch.randint(0, 2, (n,), generator=gen))
        done = terminated | truncated
        seen_done += int(done.sum())
        # Where nothing ended the two observations are the same; where it did, obs is
        # a fresh initial state (uniform in +-0.05) and the state behind it.
        assert torch.equal(info["final_obs"][~done], obs[~done])
        assert (obs[done].abs() <= 0.05).all()
        assert (info["final_obs"][done][:, [0, 2]].abs() > torch.tensor([2.4, 0.2094])).any(dim=1).all()
        assert torch.equal(env.get_state().float(), obs)
        assert (env.elapsed_steps[done] == 0).all()
    assert seen_done > 100


@pytest.mark.parametrize("sparse_reset", [True, False], ids=["cpu_reset", "accelerator_reset"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"])
def test_episode_return_and_length_add_up_the_episode(env_id, sparse_reset):
    n = 32
    env = make_native(env_id, n, seed=6)
    env._sparse_reset = sparse_reset
    rng = np.random.default_rng(6)
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    finished = 0
    obs = env.reset()
    for _ in range(450):
        actions = random_actions(env, rng, n)
        # (the masked CartPole steers from the true state: its observation has no velocities)
        steer = steering_actions(env_id, env.get_state().numpy() if "NoVel" in env_id else obs.numpy())
        if steer is not None:
            actions[::2] = steer[::2]  # MountainCarContinuous reaches its goal (and its bonus) this way
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(actions))
        assert info["episode_return"].dtype == torch.float32 and info["episode_length"].dtype == torch.int64
        ret += reward.double().numpy()
        length += 1
        done = (terminated | truncated).numpy()
        np.testing.assert_allclose(info["episode_return"].numpy()[done], ret[done], rtol=1e-6)
        np.testing.assert_array_equal(info["episode_length"].numpy()[done], length[done])
        finished += done.sum()
        ret[done] = 0.0
        length[done] = 0
    assert finished >= n


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_state_dict_round_trip_continues_bit_for_bit(env_id):
    n = 64
    env = make_native(env_id, n, seed=7)
    rng = np.random.default_rng(7)
    for _ in range(150):
        env.step(torch.as_tensor(random_actions(env, rng, n)))
    buffer = io.BytesIO()
    torch.save(env.state_dict(), buffer)  # as a checkpoint would hold it
    actions = [torch.as_tensor(random_actions(env, rng, n)) for _ in range(300)]
    expected = [env.step(a) for a in actions]

    buffer.seek(0)
    resumed = make_native(env_id, n, seed=999)
    assert resumed.load_state_dict(torch.load(buffer, weights_only=True)) is True
    for a, (obs, reward, terminated, truncated, info) in zip(actions, expected):
        obs2, reward2, terminated2, truncated2, info2 = resumed.step(a)
        assert torch.equal(obs, obs2) and torch.equal(reward, reward2)
        assert torch.equal(terminated, terminated2) and torch.equal(truncated, truncated2)
        for key in ("final_obs", "episode_return", "episode_length"):
            assert torch.equal(info[key], info2[key]), key


def test_load_state_dict_refuses_another_env():
    state = make_native("CartPole-v1", 4).state_dict()
    with pytest.raises(ValueError, match="same id and num_envs"):
        make_native("CartPole-v1", 5).load_state_dict(state)
    with pytest.raises(ValueError, match="same id and num_envs"):
        make_native("Acrobot-v1", 4).load_state_dict(state)


def test_same_seed_gives_the_same_episodes():
    a = make_native("MountainCar-v0", 16, seed=11)
    b = make_native("MountainCar-v0", 16, seed=11)
    c = make_native("MountainCar-v0", 16, seed=12)
    assert torch.equal(a.reset(), b.reset())
    assert not torch.equal(a.get_state(), c.get_state())
    assert torch.equal(c.reset(seed=11), a.reset(seed=11))  # reset(seed) reseeds
    action = torch.ones(16, dtype=torch.int64)
    for _ in range(210):  # through a time limit, so new episodes are drawn too
        out_a, out_c = a.step(action), c.step(action)
        assert torch.equal(out_a[0], out_c[0])


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
@pytest.mark.parametrize("n", [1, 100_000])
def test_runs_at_any_batch_size(env_id, n):
    env = make_native(env_id, n, seed=0)
    obs_dim = env.single_observation_space.shape[0]
    assert env.reset().shape == (n, obs_dim)
    rng = np.random.default_rng(0)
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(random_actions(env, rng, n)))
    assert obs.shape == info["final_obs"].shape == (n, obs_dim)
    assert reward.shape == terminated.shape == truncated.shape == info["episode_length"].shape == (n,)
    assert torch.isfinite(obs).all()


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_everything_stays_on_the_device(env_id, device):
    n = 8
    env = make_native(env_id, n, device=device, seed=0)
    assert isinstance(env, VecEnv) and env.copyable and env.env_id == "native:" + env_id
    assert env.reset().device.type == device.type
    rng = np.random.default_rng(0)
    for _ in range(TIME_LIMITS[env_id] + 1):  # past a time limit: the reset path too
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(random_actions(env, rng, n)).to(device))
    tensors = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, **info}
    for name, x in tensors.items():
        assert x.device.type == device.type, name
    assert obs.dtype == info["final_obs"].dtype == reward.dtype == info["episode_return"].dtype == torch.float32
    assert terminated.dtype == truncated.dtype == torch.bool
    assert info["episode_length"].dtype == torch.int64
    assert env.get_state().device.type == device.type
    env.close()


def test_discrete_actions_may_have_a_trailing_one():
    a, b = make_native("MountainCar-v0", 8, seed=2), make_native("MountainCar-v0", 8, seed=2)
    action = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    assert torch.equal(a.step(action)[0], b.step(action.view(8, 1))[0])


def test_continuous_actions_may_be_flat():
    a, b = make_native("Pendulum-v1", 8, seed=2), make_native("Pendulum-v1", 8, seed=2)
    action = torch.linspace(-3, 3, 8)
    assert torch.equal(a.step(action)[0], b.step(action.view(8, 1))[0])


@pytest.mark.parametrize("env_id", NATIVE_ENVS)
def test_step_leaves_the_callers_action_alone(env_id):
    env = make_native(env_id, 16, seed=0)
    action = torch.as_tensor(random_actions(env, np.random.default_rng(0), 16))
    before = action.clone()
    env.step(action)
    assert torch.equal(action, before)


def test_bad_actions_are_named():
    env = make_native("CartPole-v1", 4)
    with pytest.raises(EnvError, match=r"shape \(3,\), expected \(4,\)"):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(EnvError, match="integers"):
        env.step(torch.zeros(4))
    with pytest.raises(EnvError, match=r"expected \(4, 1\)"):
        make_native("Pendulum-v1", 4).step(torch.zeros(4, 2))


def test_make_native_names_close_matches():
    assert NATIVE_ENVS == tuple(TIME_LIMITS)
    assert make_native("native:Pendulum-v1", 2).env_id == "native:Pendulum-v1"
    with pytest.raises(ValueError, match="did you mean 'CartPole-v1'"):
        make_native("cartpole-v0", 2)
    with pytest.raises(ValueError, match="native envs: CartPole-v1"):
        make_native("LunarLander-v3", 2)
    with pytest.raises(ValueError, match="num_envs"):
        make_native("CartPole-v1", 0)
    with pytest.raises(ValueError, match="dtype"):
        make_native("CartPole-v1", 2, dtype=torch.float16)


def test_make_vec_env_routes_native_ids():
    from corral.envs import make_vec_env

    env = make_vec_env("native:CartPole-v1", 3)
    assert env.env_id == "native:CartPole-v1" and env.num_envs == 3
