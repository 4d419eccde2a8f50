"""The global state where the env can give it, the agents' observations where it cannot: a fake
ParallelEnv whose state() raises once an agent has left, and PettingZoo's SISL multiwalker
(whose state() raises once a walker has fallen) trained with mappo past several episode ends."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from gymnasium import spaces  # noqa: E402
from pettingzoo import ParallelEnv  # noqa: E402

import corral  # noqa: E402
from corral.envs.multiagent import make_multiagent_vec_env  # noqa: E402

QUIET = {"tensorboard": False, "progress": False}


class FallingEnv(ParallelEnv):
    """Three agents, observation ``[t, j, 1, 2]`` (float32 4) for agent j. ``agent_1`` falls at step
    ``fall_at`` (terminated, gone; its body destroyed), the others terminate at ``horizon``. The
    global state (``state_size`` values, 100 + i) exists only while every agent does: after a fall
    ``state()`` raises AttributeError, as multiwalker's does."""

    metadata = {"name": "falling_v0"}

    def __init__(self, fall_at=2, horizon=4, state_size=6):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.agents: list[str] = []
        self.fall_at, self.horizon = fall_at, horizon
        self.state_space = spaces.Box(-np.inf, np.inf, (state_size,), np.float32)
        self.bodies = [object()] * 3
        self.t = 0

    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self, agent):
        return np.array([self.t, self.possible_agents.index(agent), 1, 2], np.float32)

    def state(self):
        if any(b is None for b in self.bodies) or not self.agents:
            raise AttributeError("'NoneType' object has no attribute 'position'")
        return np.arange(self.state_space.shape[0], dtype=np.float32) + 100 + self.t

    def reset(self, seed=None, options=None):
        self.t, self.agents, self.bodies = 0, list(self.possible_agents), [object()] * 3
        return {a: self._obs(a) for a in self.agents}, {}

    def step(self, actions):
        self.t += 1
        terms = {a: (a == "agent_1" and self.t >= self.fall_at) or self.t >= self.horizon for a in self.agents}
        if terms.get("agent_1"):
            self.bodies = [b if k != 1 else None for k, b in enumerate(self.bodies)]
        obs = {a: self._obs(a) for a in self.agents}
        rew = {a: 1.0 for a in self.agents}
        self.agents = [a for a in self.agents if not terms[a]]
        return obs, rew, terms, {a: False for a in terms}, {a: {} for a in terms}


@pytest.mark.parametrize("state_size", [6, 15])  # cut to 2 per agent / each agent's 4 padded to 5
def test_the_state_falls_back_to_the_agents_observations_where_state_raises(state_size):
    env = make_multiagent_vec_env(FallingEnv, 1, {"state_size": state_size})
    L = env.layout
    assert L.has_state and L.state_dim == state_size
    block, n = state_size // 3, min(state_size // 3, 4)

    def fallback(view_obs, present):
        want = torch.zeros(state_size)
        for j in present:
            want[j * block:j * block + n] = view_obs[j, :n]
        return want

    obs = env.reset(seed=0)
    v = L.split(obs)
    assert torch.equal(v.state[0], torch.arange(state_size) + 100.0)  # the env's own state
    act = torch.zeros(1, 3, dtype=torch.long)
    obs, *_ = env.step(act)  # t=1: everyone there
    assert torch.equal(L.split(obs).state[0], torch.arange(state_size) + 101.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obs, *_ = env.step(act)  # t=2: agent_1 falls; the others act on: state() raises
        obs2, *_ = env.step(act)  # t=3: agent_1 absent
    v, v2 = L.split(obs), L.split(obs2)
    assert v.agent_mask[0].tolist() == [True, False, True]
    assert torch.equal(v.state[0], fallback(v.obs[0], [0, 1, 2]))  # agent_1's last observation is still in its slot
    assert torch.equal(v2.state[0], fallback(v2.obs[0], [0, 2]))  # absent: zeros
    assert not v2.obs[0, 1].any() and v2.state[0, block:2 * block].abs().sum() == 0
    assert len([w for w in caught if "state() failed while agents still act" in str(w.message)]) == 1
    obs, rew, term, trunc, info = env.step(act)  # t=4: the episode ends; then autoreset
    assert bool(info["episode_done"][0]) and bool(term[0])
    final = L.split(info["final_obs"])
    assert torch.equal(final.state[0], fallback(final.obs[0], [0, 2]))
    assert torch.equal(L.split(obs).state[0], torch.arange(state_size) + 100.0)  # a new episode: the env's again
    assert env.state_fallbacks == 3
    for _ in range(12):  # three more episodes
        env.step(act)
    env.close()


@pytest.mark.filterwarnings("ignore:.*state\\(\\) failed while agents still act")
def test_mappo_trains_on_the_fake_env_past_many_episode_ends():
    agent = corral.train("mappo", FallingEnv, steps=512, seed=0, save_run=False,
                         **{"env.num_envs": 2, "eval.episodes": 2, **QUIET})
    assert agent.summary["episodes"] >= 100


sisl = pytest.mark.skipif(importlib.util.find_spec("Box2D") is None, reason="multiwalker needs Box2D")


@sisl
def test_multiwalker_steps_past_several_episode_ends_with_the_fallback():
    env = make_multiagent_vec_env("pettingzoo:sisl.multiwalker_v9", 2)
    L = env.layout
    assert L.has_state and L.state_dim == 75 and L.obs_dim == 31 and L.n_agents == 3
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    episodes, mid_states = 0, []
    while episodes < 6:
        a = torch.rand(2, 3, 4, generator=g) * 2 - 1
        obs, rew, term, trunc, info = env.step(a)
        episodes += int(info["episode_done"].sum())
        mid_states.append(L.split(obs).state)
    # in-episode rows carry multiwalker's own state (its last 3 entries: the package's x, y, angle)
    assert torch.cat(mid_states)[:, -3:].abs().sum() > 0
    assert env.state_fallbacks >= 6  # every episode ended with a walker down: state() raised there
    env.close()


@sisl
def test_mappo_on_multiwalker_runs_past_several_episode_ends():
    """The crash this fixes: `corral train mappo pettingzoo:sisl.multiwalker_v9` died at the first
    episode end, reading state() after a walker had fallen."""
    agent = corral.train("mappo", "pettingzoo:sisl.multiwalker_v9", steps=2048, seed=0, save_run=False,
                         **{"env.num_envs": 2, "mappo.n_steps": 256, "eval.episodes": 2, **QUIET})
    assert agent.summary["episodes"] >= 5


def test_multiwalker_has_its_own_mappo_preset():
    """`corral train mappo pettingzoo:sisl.multiwalker_v9` (and ippo, which falls back to mappo's
    sections) reads the multiwalker section, not MAPPO's MPE defaults."""
    from corral.train.setup import build_config

    for algo in ("mappo", "ippo"):
        cfg = build_config(algo, "pettingzoo:sisl.multiwalker_v9")
        a = cfg.algo_cfg
        assert (cfg.steps, cfg.env.num_envs, a.n_steps, a.batch_size) == (100_000, 8, 64, 1024)
        assert (a.log_std_init, a.lr, a.ent_coef, a.max_grad_norm) == (-1.0, 3e-4, 0.0, 0.5)
