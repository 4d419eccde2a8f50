"""The agent dimension of corral's multi-agent envs: the packed observation row's layout
(:class:`AgentLayout`), its structured view (:class:`AgentView`) and the per-agent step results
(:class:`AgentStep`). See :mod:`corral.envs.multiagent` for what each part holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from corral.errors import UserError


class AgentStep(NamedTuple):
    """Per-agent results of one vector step, ``[N, A]`` each (``info["agents"]``)."""

    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor


class AgentView(NamedTuple):
    """The structured view of packed multi-agent observations (see :class:`AgentLayout`)."""

    obs: torch.Tensor  # [N, A, D]
    state: torch.Tensor  # [N, S]
    agent_mask: torch.Tensor  # [N, A] bool
    action_mask: torch.Tensor | None  # [N, A, K] bool (discrete actions), else None


@dataclass(frozen=True)
class AgentLayout:
    """Where each part sits in a packed observation row, and the agents' padded spaces."""

    agents: tuple[str, ...]
    obs_dim: int  # D: the padded flat size of one agent's observation
    obs_dims: tuple[int, ...]  # each agent's own flat size
    state_dim: int  # S
    has_state: bool  # the env has its own state(); else the state is the concatenated observations
    discrete: bool
    n_actions: int  # K: padded Discrete size, or the padded Box size
    act_sizes: tuple[int, ...]  # each agent's own n (Discrete) or size (Box)
    act_low: tuple[tuple[float, ...], ...] = ()  # Box: each agent's padded bounds
    act_high: tuple[tuple[float, ...], ...] = ()
    # pixel envs (corral.envs.ma_pixels): one agent's frame stack (channels, size, size); the
    # packed row is uint8 then, and the state (where the env has an image one) is such a stack too
    frame: tuple[int, ...] = ()
    state_frame: tuple[int, ...] = ()  # pixel envs: the state's frame stack (channels, side, side)

    @property
    def pixels(self) -> bool:
        return bool(self.frame)

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def state_start(self) -> int:
        return self.n_agents * self.obs_dim

    @property
    def mask_start(self) -> int:
        return self.state_start + self.state_dim

    @property
    def action_mask_start(self) -> int:
        return self.mask_start + self.n_agents

    @property
    def size(self) -> int:
        return self.action_mask_start + (self.n_agents * self.n_actions if self.discrete else 0)

    def split(self, x: torch.Tensor) -> AgentView:
        """Packed rows ``[..., F]`` -> :class:`AgentView` (``obs``, ``state`` are views)."""
        lead = x.shape[:-1]
        A, D = self.n_agents, self.obs_dim
        obs = x[..., :self.state_start].reshape(*lead, A, D)
        state = x[..., self.state_start:self.mask_start]
        mask = x[..., self.mask_start:self.action_mask_start] > 0.5
        amask = None
        if self.discrete:
            amask = x[..., self.action_mask_start:].reshape(*lead, A, self.n_actions) > 0.5
        return AgentView(obs, state, mask, amask)

    def action_space(self) -> gym.Space:
        """The joint action of one env: ``MultiDiscrete([K] * A)`` or ``Box [A, K]``."""
        if self.discrete:
            return gym.spaces.MultiDiscrete([self.n_actions] * self.n_agents)
        return gym.spaces.Box(np.array(self.act_low, np.float32), np.array(self.act_high, np.float32),
                              dtype=np.float32)

    def agent_action_space(self) -> gym.Space:
        """One agent's padded action space (what a shared policy outputs)."""
        if self.discrete:
            return gym.spaces.Discrete(self.n_actions)
        low = np.array(self.act_low, np.float32)
        high = np.array(self.act_high, np.float32)
        if not (np.all(low == low[0]) and np.all(high == high[0])):
            # a shared Gaussian head maps to one set of bounds: the agents' must agree
            raise UserError("agents' Box action bounds differ; a shared policy needs one set of bounds "
                            f"(got low {low.tolist()}, high {high.tolist()})")
        return gym.spaces.Box(low[0], high[0], dtype=np.float32)


def agent_layout(space: gym.Space) -> AgentLayout | None:
    """The :class:`AgentLayout` a multi-agent env's observation space carries, or None."""
    return getattr(space, "corral_agents", None)


def require_layout(algo: str, space: gym.Space) -> AgentLayout:
    """The layout of a multi-agent observation space; a :class:`UserError` naming ``algo``
    for any other space."""
    layout = agent_layout(space)
    if layout is None:
        raise UserError(f"{algo} needs a multi-agent env (mpe:NAME, pettingzoo:family.name, or a "
                        "module:callable returning a PettingZoo env)")
    return layout


def is_multiagent_space(space: gym.Space) -> bool:
    return agent_layout(space) is not None
