"""Fixed opponents for multi-agent envs: agents that act at random and are not trained.

``env.opponents`` names agents (exact names or ``fnmatch`` patterns such as ``adversary_*``)
of a PettingZoo env; :class:`RandomOpponents` takes them out of the env's agent list, so the
trained team sees an env of its own agents only (its observations, rewards, global state and
checkpoints), and steps them with uniformly random actions (a random valid action where the
env gives an action mask) drawn from the wrapper's own generator. The generator is seeded by
``reset(seed=...)`` and checkpointed with the env (``corral_state``), so a run against a fixed
opponent resumes bit for bit like any other.

This is the held-out opponent of a competitive game (``simple_tag``: predators against a
random prey, or the prey against random predators): each side's improvement is measured
against the same fixed opponent. Self-play is the same env without ``env.opponents``, every
agent trained on its own reward (``maddpg.rewards=agent``; MAPPO / IPPO always learn from
each agent's own reward).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import gymnasium as gym
import numpy as np

from corral.errors import UserError


def match_agents(agents: tuple[str, ...] | list[str], patterns: tuple[str, ...] | list[str], name: str) -> list[str]:
    """The agents ``patterns`` name, in the env's order; a :class:`UserError` for a pattern
    that names none, or for patterns that name every agent (nobody would be trained)."""
    chosen = [a for a in agents if any(fnmatchcase(a, p) for p in patterns)]
    for p in patterns:
        if not any(fnmatchcase(a, p) for a in agents):
            raise UserError(f"env.opponents: {p!r} names no agent of {name!r}; its agents are {list(agents)}")
    if len(chosen) == len(agents):
        raise UserError(f"env.opponents {list(patterns)} names every agent of {name!r}; leave at least one agent "
                        "to train")
    return chosen


class RandomOpponents:
    """A PettingZoo ParallelEnv without the agents ``patterns`` name, who act at random."""

    def __init__(self, env: Any, patterns: tuple[str, ...] | list[str], name: str = "env"):
        self.env = env
        self.opponents = match_agents(tuple(env.possible_agents), tuple(patterns), name)
        self._opp = set(self.opponents)
        self.possible_agents = [a for a in env.possible_agents if a not in self._opp]
        self._rng = np.random.default_rng(0)
        self._masks: dict[str, np.ndarray] = {}
        if callable(getattr(env, "corral_state", None)) and callable(getattr(env, "corral_load_state", None)):
            self.corral_state, self.corral_load_state = self._state, self._load_state

    @property
    def agents(self) -> list[str]:
        return [a for a in self.env.agents if a not in self._opp]

    def observation_space(self, agent: str) -> gym.Space:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def __getattr__(self, name: str) -> Any:  # state(), state_space, metadata, render ... of the env
        if name.startswith("corral_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _mine(self, d: dict) -> dict:
        return {a: v for a, v in d.items() if a not in self._opp}

    def _remember(self, obs: dict, infos: dict) -> None:
        """The opponents' action masks (from a Dict observation or their info), for the next step."""
        self._masks = {}
        for a in self.opponents:
            o, info = obs.get(a), infos.get(a) or {}
            mask = o.get("action_mask") if isinstance(o, dict) else info.get("action_mask")
            if mask is not None:
                self._masks[a] = np.asarray(mask, bool).reshape(-1)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng([int(seed), 0x0BB0])  # apart from the env's own seed
        obs, infos = self.env.reset(seed=seed, options=options)
        infos = infos or {}
        self._remember(obs, infos)
        return self._mine(obs), self._mine(infos)

    def _random_action(self, agent: str) -> Any:
        space = self.env.action_space(agent)
        if isinstance(space, gym.spaces.Discrete):
            mask = self._masks.get(agent)
            valid = np.arange(space.n) if mask is None else np.flatnonzero(mask)
            return int(space.start + valid[self._rng.integers(len(valid))])
        if isinstance(space, gym.spaces.Box):
            return self._rng.uniform(space.low, space.high).astype(space.dtype)
        raise UserError(f"env.opponents: agent {agent!r} has action space {space}; random opponents take "
                        "Discrete or Box actions")

    def step(self, actions: dict):
        joint = dict(actions)
        for a in self.opponents:
            if a in self.env.agents:
                joint[a] = self._random_action(a)
        obs, rew, term, trunc, infos = self.env.step(joint)
        infos = infos or {}
        self._remember(obs, infos)
        return self._mine(obs), self._mine(rew), self._mine(term), self._mine(trunc), self._mine(infos)

    def _state(self) -> dict:
        return {"env": self.env.corral_state(), "rng": self._rng.bit_generator.state,
                "masks": {a: m.astype(np.uint8) for a, m in self._masks.items()}}

    def _load_state(self, state: dict) -> None:
        self.env.corral_load_state(state["env"])
        self._rng.bit_generator.state = state["rng"]
        self._masks = {a: np.asarray(m).astype(bool) for a, m in state["masks"].items()}

    def close(self) -> None:
        self.env.close()
