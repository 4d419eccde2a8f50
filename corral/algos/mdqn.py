"""Munchausen DQN (Vieillard, Pietquin and Geist 2020): DQN whose target adds the scaled,
clipped log-policy of the action taken and backs up a soft (entropy-regularised) value::

    target = r + alpha * clip(tau * log pi(a|s), l0, 0)
               + discount * sum_a' pi(a'|s') (q(s', a') - tau * log pi(a'|s'))

with ``q`` the target network and ``pi = softmax(q / tau)`` its softmax policy. ``tau`` ln pi
is computed as ``q - tau * logsumexp(q / tau)`` (stable for small ``tau``). The soft backup
replaces the max, so ``double`` does not apply. With n-step returns the bonus is the
first step's (the replay keeps only that step's observation)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.algos.dqn import DQN, DQNConfig
from corral.config import option
from corral.errors import UserError


def munchausen_target(q_obs: torch.Tensor, q_next: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                      discount: torch.Tensor, alpha: float, tau: float, clip_min: float) -> torch.Tensor:
    """The M-DQN target ``[B]`` from the target net's Q of the observations and of the next
    observations (``[B, A]`` each), the actions taken, the (n-step) rewards and discounts."""
    tau_log_pi = q_obs - tau * torch.logsumexp(q_obs / tau, -1, keepdim=True)
    bonus = tau_log_pi.gather(-1, action.long().unsqueeze(-1)).squeeze(-1).clamp(clip_min, 0.0)
    next_tau_log_pi = q_next - tau * torch.logsumexp(q_next / tau, -1, keepdim=True)
    soft_value = ((q_next / tau).softmax(-1) * (q_next - next_tau_log_pi)).sum(-1)
    return reward + alpha * bonus + discount * soft_value


@dataclass
class MDQNConfig(DQNConfig):
    m_alpha: float = option(0.9, "Munchausen scaling alpha of the log-policy bonus", ge=0, le=1)
    m_tau: float = option(0.03, "entropy temperature tau of the softmax policy", gt=0)
    m_clip: float = option(-1.0, "lower clip l0 of the bonus tau * log pi(a|s)", le=0)


class MunchausenDQN(DQN):
    name = "mdqn"
    Config = MDQNConfig

    def __init__(self, cfg: MDQNConfig, *args, **kw):
        if cfg.double:
            raise UserError("mdqn: double has no effect (the soft backup replaces the max); set mdqn.double=false")
        super().__init__(cfg, *args, **kw)

    def shared_targets(self, batch):
        # the target net's Q of obs and next_obs, one forward: rows [B, 2, A]
        return None if self.cfg.noisy else self._target_pair(batch)

    def _target_pair(self, batch) -> torch.Tensor:
        B = batch.obs.shape[0]
        return self.target_q(torch.cat([batch.obs, batch.next_obs])).unflatten(0, (2, B)).transpose(0, 1)

    def td_target(self, batch, pair, next_action):
        if pair is None:
            pair = self._target_pair(batch)
        c = self.cfg
        return munchausen_target(pair[:, 0], pair[:, 1], batch.action, batch.reward, batch.discount,
                                 c.m_alpha, c.m_tau, c.m_clip)
