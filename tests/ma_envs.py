"""Tiny PettingZoo envs for the multi-agent tests."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class LeavingEnv(ParallelEnv):
    """Three agents with different spaces; ``agent_1`` terminates (and leaves the dicts) after
    ``leave_at`` steps, the others are truncated at ``horizon``. Agent j is paid 1 when its
    action equals ``(t + j) % 2`` (its observation shows ``t % 2``), so it can be learnt.
    ``agent_0``'s action 2 is always masked (``infos[...]["action_mask"]``); ``agent_2`` has
    a smaller observation and two actions (padding). No ``state()``: the global state is the
    agents' observations concatenated."""

    metadata = {"name": "leaving_v0"}

    def __init__(self, leave_at: int = 3, horizon: int = 6):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.agents: list[str] = []
        self.leave_at, self.horizon = leave_at, horizon
        self.t = 0
        self.rng = np.random.default_rng(0)
        self.noise = 0.0

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (2,) if agent == "agent_2" else (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2 if agent == "agent_2" else 3)

    def _obs(self, agent):
        j = self.possible_agents.index(agent)
        base = [float((self.t + j) % 2), self.t / self.horizon]
        return np.array(base if agent == "agent_2" else base + [self.noise], np.float32)

    def _infos(self):
        return {a: ({"action_mask": np.array([1, 1, 0], np.int8)} if a == "agent_0" else {}) for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.noise = float(self.rng.uniform(-1, 1))
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, self._infos()

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        assert actions.get("agent_0") != 2, "a masked action was taken"
        rewards = {a: float(int(actions[a]) == (self.t + self.possible_agents.index(a)) % 2) for a in self.agents}
        self.t += 1
        self.noise = float(self.rng.uniform(-1, 1))
        terms = {a: a == "agent_1" and self.t >= self.leave_at for a in self.agents}
        truncs = {a: self.t >= self.horizon and not terms[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = self._infos()
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def corral_state(self):
        return {"t": self.t, "noise": self.noise, "agents": [a in self.agents for a in self.possible_agents],
                "rng": self.rng.bit_generator.state}

    def corral_load_state(self, state):
        self.t, self.noise = int(state["t"]), float(state["noise"])
        self.agents = [a for a, on in zip(self.possible_agents, state["agents"]) if on]
        self.rng.bit_generator.state = state["rng"]


class TargetsEnv(ParallelEnv):
    """Two agents with Box actions in [-1, 1]: each sees a target ``c_j`` (redrawn every step)
    and is paid ``-|a_j - c_j|``; the team reward is their mean, episodes are truncated after
    ``horizon`` steps. A uniformly random team's return is ``-2/3 * horizon`` in expectation,
    a perfect one's 0. No ``state()``: the global state is the observations concatenated."""

    metadata = {"name": "targets_v0"}

    def __init__(self, horizon: int = 5):
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.horizon = horizon
        self.t = 0
        self.rng = np.random.default_rng(0)
        self.targets = np.zeros(2, np.float32)

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self):
        return {a: np.array([self.targets[j], self.t / self.horizon], np.float32)
                for j, a in enumerate(self.possible_agents) if a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.targets = self.rng.uniform(-1, 1, 2).astype(np.float32)
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: -abs(float(np.asarray(actions[a]).reshape(-1)[0]) - float(self.targets[j]))
                   for j, a in enumerate(self.possible_agents)}
        self.t += 1
        self.targets = self.rng.uniform(-1, 1, 2).astype(np.float32)
        obs = self._obs()
        done = self.t >= self.horizon
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def corral_state(self):
        return {"t": self.t, "targets": self.targets.tolist(), "live": bool(self.agents),
                "rng": self.rng.bit_generator.state}

    def corral_load_state(self, state):
        self.t, self.targets = int(state["t"]), np.array(state["targets"], np.float32)
        self.agents = list(self.possible_agents) if state["live"] else []
        self.rng.bit_generator.state = state["rng"]
