"""Small user envs for tests: reached through 'module:callable' and 'file.py:Class'."""

import gymnasium as gym
import numpy as np


class CountEnv(gym.Env):
    """obs = [t], reward = 1 each step; terminates at `length` steps (or truncates via max_steps)."""

    def __init__(self, length: int = 5, bad_step: int = -1, bad: str = "none", reward: float = 1.0):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.bad_step, self.bad, self.reward = length, bad_step, bad, reward
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([float(self.t)], np.float32)
        reward = self.reward
        if self.t == self.bad_step:
            if self.bad == "nan_obs":
                obs[0] = np.nan
            elif self.bad == "inf_reward":
                reward = float("inf")
            elif self.bad == "raise":
                raise RuntimeError("simulator exploded")
        return obs, reward, self.t >= self.length, False, {}


def make_count_env(length: int = 5, **kw):
    return CountEnv(length=length, **kw)


def short_cartpole(max_episode_steps: int = 7):
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


class BlowUpEnv(gym.Env):
    """A CartPole-shaped env whose rewards become astronomically large after `after` steps,
    so any value loss overflows: used to test the NaN-loss stop."""

    def __init__(self, after: int = 600):
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.after, self.n = after, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.n += 1
        r = 3e38 if self.n > self.after else 1.0
        return np.zeros(4, np.float32), r, False, self.n % 50 == 0, {}


class PixelTarget(gym.Env):
    """One-step episodes: a bright column at a random position in a 36x36 frame; the action
    should name that position in [-1, 1]. Reward -|action - position|: about -0.67 for a
    random policy, -0.5 for a constant 0, 0 for a perfect one."""

    observation_space = gym.spaces.Box(0, 255, (1, 36, 36), np.uint8)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.col = int(self.np_random.integers(0, 36))
        frame = np.zeros((1, 36, 36), np.uint8)
        frame[0, :, self.col] = 255
        return frame, {}

    def step(self, action):
        target = self.col / 35 * 2 - 1
        frame = np.zeros((1, 36, 36), np.uint8)
        return frame, -abs(float(action[0]) - target), True, False, {}


class PixelTargetDict(PixelTarget):
    """PixelTarget as a Dict: the frame and a vector part that carries nothing useful."""

    observation_space = gym.spaces.Dict({"frame": PixelTarget.observation_space,
                                         "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def reset(self, seed=None, options=None):
        frame, info = super().reset(seed=seed)
        return {"frame": frame, "vec": np.zeros(2, np.float32)}, info

    def step(self, action):
        frame, r, term, trunc, info = super().step(action)
        return {"frame": frame, "vec": np.ones(2, np.float32)}, r, term, trunc, info


class LivesEnv(gym.Env):
    """An Atari-shaped game without Atari: three lives of three steps each, reward 1 per
    step. A lost life reads as ``terminated`` (as corral's EpisodicLife wrapper makes it) and
    the next ``reset`` goes on with the game; the whole game's score (9) is reported under
    corral's episode key when the last life is lost."""

    corral_reports_episodes = True

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.lives, self.life_t, self.score = 0, 0, 0.0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if self.lives == 0 or seed is not None:
            self.lives, self.score = 3, 0.0
        self.life_t = 0
        return np.array([float(self.lives)], np.float32), {}

    def step(self, action):
        from corral.envs.group import EPISODE_KEY

        self.life_t += 1
        self.score += 1.0
        info = {}
        lost = self.life_t == 3
        if lost:
            self.lives -= 1
            if self.lives == 0:
                info[EPISODE_KEY] = self.score
        return np.array([float(self.lives)], np.float32), 1.0, lost, False, info


class RampEnv(gym.Env):
    """obs = [t], reward = t after the t-th step; never terminates, truncates after `limit`
    steps: a truncated step's final observation [limit] differs from the reset one [0]."""

    def __init__(self, limit: int = 3):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.limit, self.t = limit, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t)], np.float32), float(self.t), False, self.t >= self.limit, {}


class IdentityEnv(gym.Env):
    """Stable-Baselines3's identity test env in corral's words: each observation is a random
    element of ``space``, the action space is the same space, and the reward is 1 when the
    action equals the observation (every part of it); 100 steps per episode (truncated). A
    policy that copies its input scores 100."""

    def __init__(self, space: gym.Space, ep_length: int = 100):
        self.observation_space = self.action_space = space
        self.ep_length = ep_length
        self.t = 0
        self.state = None

    def _draw(self):
        space = self.observation_space
        if isinstance(space, gym.spaces.Discrete):
            return int(space.start + self.np_random.integers(space.n))
        if isinstance(space, gym.spaces.MultiDiscrete):
            return self.np_random.integers(space.nvec).astype(space.dtype)
        return self.np_random.integers(0, 2, size=space.shape).astype(space.dtype)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.state = self._draw()
        return self.state, {}

    def step(self, action):
        reward = float(np.all(np.asarray(action) == np.asarray(self.state)))
        self.t += 1
        self.state = self._draw()
        return self.state, reward, False, self.t >= self.ep_length, {}


class IdentityBoxEnv(gym.Env):
    """Stable-Baselines3's continuous identity test env in corral's words: the observation is
    uniform in [-1, 1], the action space the same Box, reward 1 where the action is within
    ``eps`` of the observation; 100 steps per episode (truncated)."""

    def __init__(self, eps: float = 0.5, ep_length: int = 100):
        self.observation_space = self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.eps, self.ep_length = eps, ep_length
        self.t, self.state = 0, None

    def _draw(self):
        return self.np_random.uniform(-1.0, 1.0, (1,)).astype(np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.state = 0, self._draw()
        return self.state, {}

    def step(self, action):
        reward = float(abs(float(np.asarray(action).reshape(-1)[0]) - float(self.state[0])) <= self.eps)
        self.t += 1
        self.state = self._draw()
        return self.state, reward, False, self.t >= self.ep_length, {}


def identity_discrete(n: int = 4):
    return IdentityEnv(gym.spaces.Discrete(n))


def identity_multidiscrete(n: int = 3):
    return IdentityEnv(gym.spaces.MultiDiscrete([n, n]))


def identity_multibinary(n: int = 3):
    return IdentityEnv(gym.spaces.MultiBinary(n))


class DiscretePartEnv(gym.Env):
    """A Dict observation with a Discrete part (``cell``) beside a vector part (``vec``)."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(5),
                                                  "vec": gym.spaces.Box(-100, 100, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self):
        return {"cell": int(self.t % 5), "vec": np.array([50.0 + self.t, -30.0], np.float32)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 10, {}


class DictIdentityEnv(gym.Env):
    """The identity task inside a Dict: ``cell`` is a random element of Discrete(8, start=3)
    beside a ``noise`` vector; the action space is Discrete(4) and the reward is 1 when the
    action is ``(cell - 3) % 4``; 100 steps per episode (truncated). The best policy scores
    100; one that cannot tell the cells apart about 25."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(8, start=3),
                                                  "noise": gym.spaces.Box(-1, 1, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(4)
        self.t = 0

    def _obs(self):
        self.cell = int(3 + self.np_random.integers(8))
        return {"cell": self.cell, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == (self.cell - 3) % 4)
        self.t += 1
        return self._obs(), reward, False, self.t >= 100, {}


class BigCellEnv(gym.Env):
    """A Dict with a Discrete(500) part (Taxi's state count) beside a 2-vector; nothing to learn."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(500),
                                                  "vec": gym.spaces.Box(-1, 1, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class DictCellTarget(gym.Env):
    """One-step episodes for continuous actions: ``cell`` (Discrete(4)) names a target in
    [-1, 1] beside a ``vec`` part; reward -|action - target|."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(4),
                                                  "vec": gym.spaces.Box(-1, 1, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = int(self.np_random.integers(4))
        return {"cell": self.cell, "vec": np.zeros(2, np.float32)}, {}

    def step(self, action):
        r = -abs(float(action[0]) - (self.cell / 3 * 2 - 1))
        return {"cell": self.cell, "vec": np.zeros(2, np.float32)}, r, True, False, {}


class TinyExtractor(__import__("torch").nn.Module):
    """A user's feature extractor for tests: one Linear + Tanh over the flat observation."""

    def __init__(self, obs_space, out_dim: int = 32):
        import math

        import torch

        super().__init__()
        self.out_dim = out_dim
        self.net = torch.nn.Sequential(torch.nn.Linear(int(math.prod(obs_space.shape)), out_dim), torch.nn.Tanh())

    def forward(self, x):
        return self.net(x.flatten(1).float())


def trained_and_resumed(algo: str, env: str, sets: list[str], n: int, seed: int, run_dir):
    """Exact-resume fixture: ``(a, b)``, ``a`` a Learner trained 2n steps in one go, ``b`` the
    agent of a CLI run trained n steps into ``run_dir`` and resumed there to 2n."""
    import corral
    from corral.cli import main
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    a = Learner(build_config(algo, env, steps=2 * n, seed=seed, sets=sets), None)
    a.train()
    args = sum((["--set", s] for s in sets), [])
    assert main(["train", algo, env, "--steps", str(n), "--seed", str(seed), "--run-dir", str(run_dir), *args]) == 0
    assert main(["resume", str(run_dir), "--steps", str(2 * n)]) == 0
    return a, corral.load(run_dir / "checkpoints" / "latest.pt")


def ppo_at_the_settings_of(algo: str, env: str) -> dict:
    """``algo``'s preset for ``env`` as overrides for plain ``ppo``: the same envs and every option
    PPO has (rollout, epochs, lr and its schedule, gammas, observation normalisation), without the
    exploration bonus; for "does the bonus help" comparisons (ppo_rnd, ppo_icm)."""
    from dataclasses import fields

    from corral.algos.ppo import PPOConfig
    from corral.train.setup import load_preset

    preset = load_preset(algo, env)
    ppo = {f.name for f in fields(PPOConfig)}
    return {"env.num_envs": preset["env"]["num_envs"],
            **{f"ppo.{k}": v for k, v in preset[algo].items() if k in ppo}}
