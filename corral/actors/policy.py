"""The policy ``corral export`` writes, as the algorithm hands it over
(``Algorithm.export_policy``; the exporter is ``corral/export.py``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class StateSpec(NamedTuple):
    """One recurrent state tensor of an exported policy: ``[B, *shape]`` of ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


class DeterministicPolicy(nn.Module):
    """The default ``Algorithm.export_policy()``: raw flat observations -> env actions via the
    actor's ``act(obs, deterministic=True)`` (the actor contract, docs/algorithms.md). Its
    ``state_specs`` is empty: a feed-forward policy."""

    state_specs: tuple[StateSpec, ...] = ()

    def __init__(self, actor: nn.Module):
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs, deterministic=True, generator=None)


class RecurrentDeterministicPolicy(nn.Module):
    """A recurrent algorithm's ``export_policy()``: ``(obs, state) -> (action, next state)``
    through the actor's ``act(obs, state, starts=None, deterministic=True)``. The exported
    graph has no episode-start input: the caller passes zeros as the state at an episode's
    first step (what corral's policies do there), which also keeps the graph free of branches."""

    def __init__(self, actor: nn.Module):
        super().__init__()
        self.actor = actor
        self.state_specs = (StateSpec("state", (int(actor.state_dim),)),)

    def forward(self, obs: torch.Tensor, state: torch.Tensor):
        return self.actor.act(obs, state, None, deterministic=True)
