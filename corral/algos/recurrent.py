"""What every recurrent algorithm shares: each env column's state and episode-start flag.

``explore`` acts from ``(self._state, self._starts)`` and hands both to ``observe`` in its
extras (the state *entering* the step, before the core resets it at a start), so rollouts,
replay and collectors' fragments store what the policy acted from. The loops say where
episodes ended (``episodes_ended``); the next step of those columns starts a new episode.
The state is column state (a scheme that feeds several collectors' fragments through the
same columns swaps it) and goes into checkpoints (exact resume)."""

from __future__ import annotations

import torch

from corral.algos.base import Policy, RecurrentPolicy


class RecurrentColumns:
    """Mixin for an Algorithm whose ``actor`` has ``initial_state(batch, device)``."""

    recurrent = True

    def init_columns(self) -> None:
        n, dev = self.num_envs, self.device
        self._state = self.actor.initial_state(n, dev)
        self._starts = torch.ones(n, dtype=torch.bool, device=dev)  # the run's first step starts episodes
        self._no_starts = torch.zeros(n, dtype=torch.bool, device=dev)

    def step_columns(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Move the columns to ``state`` (after acting); returns the state and starts that entered the step."""
        entered = self._state, self._starts
        self._state, self._starts = state, self._no_starts  # until the loop says where episodes ended
        return entered

    def episodes_ended(self, ended: torch.Tensor) -> None:
        self._starts = ended.to(torch.bool)

    def column_state(self) -> dict:
        return {**super().column_state(), "_state": self._state.clone(), "_starts": self._starts.clone()}

    def initial_state(self, batch: int) -> torch.Tensor:
        return self.actor.initial_state(batch, self.device)

    def act(self, obs, deterministic: bool = True):
        raise TypeError(f"{self.name} is recurrent: act with act_recurrent(obs, state, starts) or policy()")

    def policy(self, deterministic: bool = True) -> Policy:
        return RecurrentPolicy(self, deterministic)

    def export_policy(self):
        from corral.actors.policy import RecurrentDeterministicPolicy

        return RecurrentDeterministicPolicy(self.actor)

    def columns_state(self) -> dict:
        return {"rnn_state": self._state.clone(), "rnn_starts": self._starts.clone()}

    def load_columns_state(self, state: dict) -> None:
        self._state = state["rnn_state"].to(self.device).clone()
        self._starts = state["rnn_starts"].to(self.device).clone()
