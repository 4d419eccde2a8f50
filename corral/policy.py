"""What evaluation and video act with: a policy ``policy(obs) -> env actions`` told where episodes
ended. Below both the envs (video) and the algorithms (``corral.algos.base.RecurrentPolicy``
carries an algorithm's state), so neither imports the other for it."""

from __future__ import annotations

import torch


class Policy:
    """What evaluation and video act with: ``policy(obs) -> env actions`` for a batch, told
    after every env step where episodes ended (``episodes_ended``), which a recurrent policy
    needs to reset its state there. This one wraps a stateless function."""

    def __init__(self, act):
        self._act = act

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return self._act(obs)

    def episodes_ended(self, ended: torch.Tensor) -> None:
        pass

    def rewarded(self, reward: torch.Tensor) -> None:
        """The env's rewards ``[N]`` for the step just taken, before ``episodes_ended`` (a policy
        that takes its previous reward as an input, NGU's, keeps them)."""


def as_policy(act) -> Policy:
    """``act`` itself when it is a :class:`Policy`, else a stateless one around it."""
    return act if isinstance(act, Policy) else Policy(act)
