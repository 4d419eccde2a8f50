"""Env families behind extras (Box2D, MuJoCo, Atari): a few hundred steps each through
``make_vec_env``, one env per family through the whole agent loop, and the Atari
preprocessing. A family whose package is missing is skipped."""

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import ClipReward

import corral
from corral.envs import SyncVecEnv, make_vec_env
from corral.envs.atari import AtariOptions, EpisodicLife, FireReset, RawEpisodeStats, atari_options
from corral.errors import UserError

# Box2D's SWIG types warn on import under Python 3.12+'s stricter importlib; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:builtin type .* has no __module__ attribute:DeprecationWarning")


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    # MuJoCo writes its warnings (Gymnasium's models use a deprecated attribute) to
    # MUJOCO_LOG.TXT in the working directory: keep it out of the repository.
    monkeypatch.chdir(tmp_path)


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # present in sys.modules as None: hidden
        return False


box2d = pytest.mark.skipif(not installed("Box2D"), reason="Box2D is not installed (pip install 'corral[box2d]')")
mujoco = pytest.mark.skipif(not installed("mujoco"), reason="MuJoCo is not installed (pip install 'corral[mujoco]')")
atari = pytest.mark.skipif(not (installed("ale_py") and installed("cv2")),
                           reason="ale-py or OpenCV is not installed (pip install 'corral[atari]')")

FAMILY_ENVS = [
    pytest.param("LunarLander-v3", (8,), marks=box2d),
    pytest.param("LunarLanderContinuous-v3", (8,), marks=box2d),
    pytest.param("BipedalWalker-v3", (24,), marks=box2d),
    pytest.param("BipedalWalkerHardcore-v3", (24,), marks=box2d),
    pytest.param("CarRacing-v3", (96, 96, 3), marks=box2d),
    pytest.param("HalfCheetah-v5", (17,), marks=mujoco),
    pytest.param("Hopper-v5", (11,), marks=mujoco),
    pytest.param("Walker2d-v5", (17,), marks=mujoco),
    pytest.param("Ant-v5", (105,), marks=mujoco),
    pytest.param("Humanoid-v5", (348,), marks=mujoco),
    pytest.param("Pong", (4, 84, 84), marks=atari),
    pytest.param("ALE/Breakout-v5", (4, 84, 84), marks=atari),
]


def random_actions(space, n, g):
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(0, int(space.n), (n,), generator=g)
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    return low + (high - low) * torch.rand(n, *space.shape, generator=g)


@pytest.mark.parametrize("env_id,obs_shape", FAMILY_ENVS)
def test_family_envs_step_through_make_vec_env(env_id, obs_shape):
    n, steps = 2, 300
    env = make_vec_env(env_id, n)
    obs = env.reset(seed=0)
    image = len(obs_shape) == 3
    assert obs.shape == (n, *obs_shape) and obs.dtype == (torch.uint8 if image else torch.float32)
    assert env.single_observation_space.shape == obs_shape
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        obs, rew, term, trunc, info = env.step(random_actions(env.single_action_space, n, g))
        assert obs.shape == (n, *obs_shape) and rew.dtype == torch.float32
        ended = term | trunc
        assert torch.equal(info["final_obs"][~ended], obs[~ended])  # the contract where no episode ended
        assert not (info["episode_done"] & ~ended).any()
        if image and "CarRacing" not in env_id:
            assert rew.abs().max() <= 1.0  # Atari: clipped for training
    assert env.out_of_bounds_actions == 0
    env.close()


AGENT_ENVS = [
    pytest.param("LunarLander-v3", marks=box2d),
    pytest.param("CarRacing-v3", marks=box2d),  # RGB frames, channels last
    pytest.param("HalfCheetah-v5", marks=mujoco),
    pytest.param("Pong", marks=atari),
]


@pytest.mark.parametrize("env_id", AGENT_ENVS)
def test_one_env_per_family_runs_through_the_agent_loop(env_id):
    agent = corral.train(
        "ppo", env_id, steps=128, save_run=False,
        **{"eval.episodes": 1, "eval.num_envs": 1, "tensorboard": False, "ppo.n_steps": 64, "ppo.batch_size": 64,
           "progress": False},
    )
    assert np.isfinite(agent.summary["eval_return"])
    obs = make_vec_env(env_id, 1).reset(seed=0)
    action = agent.act(obs.numpy())
    assert action.shape[0] == 1


# --- Atari


@atari
def test_atari_short_names_and_full_ids_give_the_same_preprocessed_game():
    a = make_vec_env("Pong", 1)
    b = make_vec_env("ALE/Pong-v5", 1)
    c = make_vec_env("pong", 1)
    assert a.env_id == "Pong"
    for env in (a, b, c):
        assert env.single_observation_space.shape == (4, 84, 84) and env.single_action_space.n == 6
    obs = [env.reset(seed=3) for env in (a, b, c)]
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[0], obs[2])
    acts = torch.randint(0, 6, (40, 1), generator=torch.Generator().manual_seed(0))
    for act in acts:
        ra, rb = a.step(act), b.step(act)
        assert torch.equal(ra[0], rb[0]) and torch.equal(ra[1], rb[1])


@atari
def test_atari_wrappers_can_be_turned_off_or_configured():
    raw = make_vec_env("Pong", 1, atari_wrappers=False)
    assert raw.single_observation_space.shape == (210, 160, 3)  # ALE v5 as Gymnasium makes it
    small = make_vec_env("Pong", 1, atari_wrappers={"screen_size": 64, "frame_stack": 2})
    assert small.single_observation_space.shape == (2, 64, 64)
    ev = make_vec_env("Breakout", 1, atari_wrappers="eval").envs[0]
    assert not any(isinstance(layer, (EpisodicLife, ClipReward)) for layer in _layers(ev))
    assert any(isinstance(layer, FireReset) for layer in _layers(ev))  # Breakout waits for FIRE
    train = make_vec_env("Breakout", 1, kwargs={"frameskip": 3}).envs[0]
    assert any(isinstance(layer, EpisodicLife) for layer in _layers(train))
    pre = next(layer for layer in _layers(train) if isinstance(layer, gym.wrappers.AtariPreprocessing))
    assert pre.frame_skip == 3 and train.unwrapped._frameskip == 1
    with pytest.raises(UserError, match="unknown Atari wrapper option 'frame_stak'; did you mean frame_stack"):
        make_vec_env("Pong", 1, atari_wrappers={"frame_stak": 2})


@atari
def test_subproc_steps_atari_exactly_like_sync():
    actions = torch.randint(0, 4, (60, 2), generator=torch.Generator().manual_seed(1))
    out = []
    for backend in ("sync", "subproc"):
        env = make_vec_env("Breakout", 2, backend=backend, **({"num_workers": 2} if backend == "subproc" else {}))
        seq = [env.reset(seed=0)]
        for a in actions:
            o, r, te, tr, info = env.step(a)
            seq += [o, r, te, tr, info["final_obs"]]
        env.close()
        out.append(seq)
    assert all(torch.equal(x, y) for x, y in zip(*out))


def _layers(env):
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


class FakeAle:
    def __init__(self):
        self.n = 3

    def lives(self):
        return self.n


class FakeAtari(gym.Env):
    """ALE-shaped: 3 lives, one lost every 4 steps; 5 points a step; FIRE is action 1."""

    observation_space = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self):
        self.ale = FakeAle()
        self.fired = 0

    def get_action_meanings(self):
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.ale.n, self.t = 3, 0
        return np.zeros((2, 2), np.uint8), {}

    def step(self, action):
        self.fired += action == 1
        self.t += 1
        if self.t % 4 == 0:
            self.ale.n -= 1
        return np.full((2, 2), self.t, np.uint8), 5.0, self.ale.n == 0, False, {}


def test_episodic_life_and_clipping_keep_the_raw_game_score_and_length():
    def make():
        env = RawEpisodeStats(FakeAtari())
        env = EpisodicLife(env)
        return ClipReward(env, -1.0, 1.0)

    env = SyncVecEnv([make])
    env.reset(seed=0)
    terms, rewards, episodes = [], [], []
    for _ in range(24):
        _, rew, term, _, info = env.step(torch.zeros(1, dtype=torch.long))
        terms.append(term.item())
        rewards.append(rew.item())
        if info["episode_done"].item():
            episodes.append((info["episode_return"].item(), info["episode_length"].item()))
    assert set(rewards) == {1.0}  # the agent trains on clipped rewards
    # a life is lost every 4 game steps: terminated for the value targets...
    assert [i for i, t in enumerate(terms) if t][:3] == [3, 6, 9]
    # ...but an episode is the whole game (the no-op after each lost life is a game step too):
    # 12 game steps of 5 points, 10 of them the agent's
    assert episodes == [(60.0, 10), (60.0, 10)]


def test_fire_reset_presses_fire_after_each_reset():
    env = FireReset(FakeAtari())
    env.reset(seed=0)
    assert env.unwrapped.fired == 1 and env.unwrapped.t == 2  # FIRE, then action 2


def test_atari_options_read_true_eval_and_dicts():
    assert atari_options(True) == AtariOptions()
    assert atari_options(False) is None
    ev = atari_options("eval")
    assert not ev.episodic_life and not ev.clip_rewards and ev.frame_stack == 4
    assert atari_options({"noop_max": 0}).noop_max == 0
    with pytest.raises(UserError, match="atari_wrappers must be"):
        atari_options("train")


# --- missing packages name the extra to install


def _hide(monkeypatch, package, gym_modules=None):
    """Make ``import package`` fail as if it were not installed; Gymnasium's modules that
    imported it are dropped so they import again (and fail). Extension modules stay
    loaded: loading one twice aborts the process."""
    monkeypatch.setitem(sys.modules, package, None)
    for name in list(sys.modules):
        if gym_modules and name.startswith(gym_modules):
            monkeypatch.delitem(sys.modules, name)


def test_missing_box2d_names_the_extra(monkeypatch):
    _hide(monkeypatch, "Box2D", "gymnasium.envs.box2d")
    with pytest.raises(UserError, match=r"pip install 'corral\[box2d\]'"):
        make_vec_env("LunarLander-v3", 1)


def test_missing_mujoco_names_the_extra(monkeypatch):
    _hide(monkeypatch, "mujoco", "gymnasium.envs.mujoco")
    with pytest.raises(UserError, match=r"pip install 'corral\[mujoco\]'"):
        make_vec_env("HalfCheetah-v5", 1)


def test_missing_ale_names_the_extra(monkeypatch):
    _hide(monkeypatch, "ale_py")
    with pytest.raises(UserError, match=r"'Breakout' is an Atari game and needs ale-py: pip install 'corral\[atari\]'"):
        make_vec_env("Breakout", 1)


def test_missing_opencv_names_the_extra(monkeypatch):
    if not installed("ale_py"):
        pytest.skip("ale-py is not installed")
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(UserError, match=r"OpenCV: pip install 'corral\[atari\]'"):
        make_vec_env("Pong", 1)


# --- learning (slow: about 6 minutes on a shared 2-core machine)


@pytest.mark.slow
@box2d
def test_ppo_learns_lunar_lander_to_a_deterministic_eval_of_200(tmp_path):
    # The preset (rl-baselines3-zoo's: 16 envs, 1M steps); "learns" is the best periodic
    # deterministic evaluation, checked again on episodes it has not seen.
    corral.train("ppo", "LunarLander-v3", seed=0, run_dir=str(tmp_path / "run"),
                 **{"eval.every": 50_000, "eval.episodes": 10, "tensorboard": False, "progress": False})
    agent = corral.load(tmp_path / "run")  # its best.pt
    assert agent.cfg.steps <= 1_000_000
    result = corral.evaluate(agent, "LunarLander-v3", episodes=20, seed=123)
    assert result["mean_return"] >= 200, result
