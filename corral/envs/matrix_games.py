"""Small cooperative games with known answers, as PettingZoo ParallelEnvs (``corral[multiagent]``).

``TwoStepGame``: the two-step matrix game of Rashid et al. 2018 (QMIX, Figure 3). In the first
step agent 0's action picks the second game (0: game 2A, 1: game 2B; agent 1's first action
does nothing). In game 2A every joint action pays 7; in game 2B the payoff is
``[[0, 1], [1, 8]]`` (row: agent 0, column: agent 1). Both agents get the shared reward; the
optimum is 8 (go to 2B, then both play 1). VDN's additive decomposition cannot represent
2B's payoff and settles on 7; QMIX's monotonic mixer, conditioned on the state, finds 8.
Observations and the global state are the one-hot of the current state (1, 2A, 2B).

``corral train qmix corral.envs.matrix_games:TwoStepGame``."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]], np.float32)


class TwoStepGame(ParallelEnv):
    metadata = {"name": "two_step_game_v0"}

    def __init__(self):
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        self._state = 0  # 0: first step, 1: game 2A, 2: game 2B

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def state(self):
        s = np.zeros(3, np.float32)
        s[self._state] = 1.0
        return s

    def _obs(self):
        return {a: self.state() for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self._state = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        a0, a1 = int(actions["agent_0"]), int(actions["agent_1"])
        if self._state == 0:
            self._state = 1 + a0
            reward, done = 0.0, False
        else:
            reward = 7.0 if self._state == 1 else float(PAYOFF_2B[a0, a1])
            done = True
        obs = self._obs()
        rewards = {a: reward for a in self.agents}
        terms = {a: done for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    # exact resume: the whole state is two numbers
    def corral_state(self):
        return {"state": self._state, "agents": len(self.agents)}

    def corral_load_state(self, state):
        self._state = int(state["state"])
        self.agents = list(self.possible_agents) if int(state["agents"]) else []
