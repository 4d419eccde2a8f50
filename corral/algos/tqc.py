"""TQC (Kuznetsov et al. 2020, "Controlling Overestimation Bias with Truncated Mixture of
Continuous Distributional Quantile Critics").

SAC with distributional critics: each of ``N`` critics outputs ``M`` quantiles of the return
(one batched module, ``[N, B, M]``). The target pools the ``N * M`` next-state quantiles of
the target critics, sorts them and drops the ``k * N`` largest (``k`` per net: the truncation
that controls overestimation, in place of SAC's min), then ``r + gamma (z - alpha log pi)``.
Each critic regresses its quantiles at fractions ``(2i + 1) / 2M`` on all kept atoms with
the quantile Huber loss (kappa 1). The actor maximises the mean over all quantiles of all
critics; the temperature is SAC's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.actors.offpolicy import Critics
from corral.algos.distributional import QuantileHuber as _QuantileHuber  # noqa: F401 (its old home)
from corral.algos.distributional import quantile_huber_loss
from corral.algos.sac import SAC, SACConfig
from corral.config import option
from corral.errors import UserError


@dataclass
class TQCConfig(SACConfig):
    n_critics: int = option(2, "critics N (the paper: 5; sb3-contrib: 2)", ge=1)
    n_quantiles: int = option(25, "quantiles M per critic", ge=1)
    top_quantiles_to_drop_per_net: int = option(2, "k: the target drops the k * N largest pooled atoms", ge=0)
    kappa: float = option(1.0, "quantile Huber threshold (0: plain quantile regression)", ge=0)


class TQC(SAC):
    name = "tqc"
    Config = TQCConfig

    def __init__(self, cfg: TQCConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if cfg.top_quantiles_to_drop_per_net >= cfg.n_quantiles:
            raise UserError(f"tqc: top_quantiles_to_drop_per_net={cfg.top_quantiles_to_drop_per_net} drops every "
                            f"quantile of n_quantiles={cfg.n_quantiles}; set it below n_quantiles (default 2 of 25)")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        M = cfg.n_quantiles
        # the fractions each critic's outputs estimate: midpoints of M equal bins
        self.taus = (torch.arange(M, dtype=torch.float32, device=device) + 0.5) / M
        self.kept = cfg.n_critics * (M - cfg.top_quantiles_to_drop_per_net)

    def make_critics(self, actor):
        cfg = self.cfg
        own = self.obs_space if actor.enc.trainable else None
        return Critics(actor.enc.dim, actor.box.dim, cfg.n_critics, tuple(cfg.hidden), cfg.activation, own,
                       n_out=cfg.n_quantiles)

    def truncated_target(self, next_quantiles: torch.Tensor, next_logp: torch.Tensor, reward: torch.Tensor,
                         discount: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``[B, kept]`` target atoms from the target critics' ``[N, B, M]`` next quantiles:
        pooled over critics, sorted, the largest ``k * N`` dropped."""
        B = next_quantiles.shape[1]
        pooled = next_quantiles.transpose(0, 1).reshape(B, -1)
        z = pooled.sort(-1).values[:, :self.kept]
        return reward[:, None] + discount[:, None] * (z - alpha * next_logp[:, None])

    def critic_loss(self, batch, obs, action, alpha, noise):
        enc, view = self.actor.enc, self.critics.view
        with torch.no_grad():
            next_obs = enc(batch.next_obs)
            next_action, next_logp = self.actor(next_obs, noise=noise["next"])
            next_quantiles = self.critics_target(view(batch.next_obs, next_obs), next_action)
            target = self.truncated_target(next_quantiles, next_logp, batch.reward, batch.discount, alpha)
        quantiles = self.critics(view(batch.obs, obs), action)  # [N, B, M]
        B = quantiles.shape[1]
        # every critic's quantiles against all kept atoms: pooled as N * M predictions, each at its tau
        pred, taus = quantiles.transpose(0, 1).reshape(B, -1), self.taus.repeat(self.cfg.n_critics)
        per_row = (_QuantileHuber.apply(pred, target, taus, self.cfg.kappa) if self.cfg.kappa > 0
                   else quantile_huber_loss(pred, target, taus, 0.0))
        per_row = per_row / quantiles.shape[0] / quantiles.shape[2]  # the mean over (critic, quantile, atom)
        loss = (per_row * batch.weights).mean() if self.cfg.prioritized else per_row.mean()
        return loss, quantiles.detach().mean(-1), (per_row.detach() if self.cfg.prioritized else None)

    def actor_q(self, obs_view, new_action, noise):
        """The mean over every critic's quantiles (TQC's policy objective)."""
        return self.critics(obs_view, new_action).mean((0, 2))
