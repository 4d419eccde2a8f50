"""IMPALA (Espeholt et al. 2018): actor-critic trained on fragments from collectors whose
parameters lag behind the learner's, with the V-trace correction (``corral.returns.vtrace``).
APPO is the preset with PPO's clipped surrogate on the V-trace advantages.

A member of the on-policy family (``corral.algos.onpolicy``): the loop's actor-critic, rollout
storage, ``explore`` and ``observe`` (stored log-probs are the behaviour policy mu), and the
parts it shares with PPO (``SurrogateParts``: Adam, reward scaling, the clip range's schedule,
the target-KL stop). Its own parts: V-trace targets in place of GAE, computed from the current
network on each minibatch, bootstrap value included (never a value from before the update's
earlier minibatches); minibatches of env columns, so every sequence stays whole for the
V-trace recursion; and its loss (``minibatch_step``). Run in-process
(``scheme.collectors=1``) every fragment is on-policy and V-trace reduces to n-step
returns; with ``scheme.collectors=K`` and ``scheme.collect=async`` collectors never wait
for the learner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from corral.algos.onpolicy import normalized
from corral.algos.ppo import SurrogateConfig, SurrogateParts
from corral.config import option
from corral.returns import rollout_next_values, vtrace


@dataclass
class IMPALAConfig(SurrogateConfig):
    """PPO's shared options (``SurrogateConfig``: no GAE lambda, no value clipping: its targets are
    V-trace's, its value loss the paper's plain regression) with IMPALA's defaults and V-trace's."""

    n_steps: int = option(32, "unroll length: env steps per env in a fragment", ge=1)
    batch_size: int = option(0, "transitions per minibatch, whole env columns (0: the whole batch)", ge=0)
    n_epochs: int = option(1, "passes over each batch (IMPALA: 1; APPO: more)", ge=1)
    lr: float = option(5e-4, "Adam learning rate", gt=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    max_grad_norm: float = option(40.0, "global gradient norm clip", gt=0)
    rho_bar: float = option(1.0, "V-trace clip of the importance weight in the TD error (rho-bar)", gt=0)
    c_bar: float = option(1.0, "V-trace clip of the trace coefficients (c-bar)", gt=0)
    surrogate: bool = option(False, "APPO: PPO's clipped surrogate (clip_range) on the V-trace advantages")
    normalize_advantage: bool = option(False, "normalize the V-trace policy-gradient advantages per minibatch")


class IMPALA(SurrogateParts):
    name = "impala"
    grad_sharding = None  # minibatch sharding (PPO's) does not cover this update
    Config = IMPALAConfig
    STATS = ("pg_loss", "v_loss", "entropy", "approx_kl", "rho_mean", "rho_clipfrac")
    KL = 3

    def prepare_batch(self):
        """The rollout as ``[T, N]`` columns plus the observation after its last step."""
        return (self.storage.data, self._last_obs, [])

    def minibatch_plan(self, batch):
        """Per epoch, the env columns in groups of ``batch_size // T`` (the last group may be
        smaller); ``slice(None)`` is all of them."""
        cfg = self.cfg
        T, N = batch[0].rewards.shape
        cols = N if cfg.batch_size <= 0 else max(1, min(N, cfg.batch_size // T))
        for _ in range(cfg.n_epochs):
            if cols >= N:
                yield slice(None)
            else:
                yield from torch.randperm(N, generator=self.rng["minibatch"], device=self.device).split(cols)

    def minibatch_step(self, batch, c, clip: float):
        cfg = self.cfg
        data, last_obs, targets = batch
        mu_log_prob = data.log_probs[:, c]
        log_prob, entropy, value = self.column_outputs(data, c)
        log_rho = log_prob.detach() - mu_log_prob
        with torch.no_grad():
            # bootstrap values from the current network, in every minibatch
            truncated = data.truncated[:, c]
            last_value, final_values = self.column_bootstraps(data, last_obs, c)
            next_values = rollout_next_values(value.detach(), last_value, truncated, final_values)
            vs, pg_adv = vtrace(log_rho, data.rewards[:, c], value.detach(), next_values,
                                data.terminated[:, c], data.truncated[:, c], cfg.gamma, cfg.rho_bar, cfg.c_bar)
            if cfg.normalize_advantage:
                pg_adv = normalized(pg_adv)
        if cfg.surrogate:
            ratio = (log_prob - mu_log_prob).exp()
            pg_loss = torch.max(-pg_adv * ratio, -pg_adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        else:
            pg_loss = -(pg_adv * log_prob).mean()
        v_loss = F.mse_loss(value, vs)
        entropy_loss = entropy.mean()
        loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
        with torch.no_grad():
            rho = log_rho.exp()
            approx_kl = ((rho - 1.0) - log_rho).mean()
            stats = torch.stack([pg_loss.detach(), v_loss.detach(), entropy_loss.detach(), approx_kl,
                                 rho.mean(), (rho > cfg.rho_bar).float().mean()])
        targets.append((vs.flatten(), value.detach().flatten()))

        def apply():
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()  # clips the global gradient norm, then Adam

        return stats, apply

    def column_outputs(self, data, c):
        """Log-probs of the stored actions, entropies and values ``[T, n]`` of the columns ``c``."""
        T = data.rewards.shape[0]
        obs, actions = data.obs[:, c], data.actions[:, c]
        log_prob, entropy, value = self.actor.evaluate_actions(obs.flatten(0, 1), actions.flatten(0, 1))
        return log_prob.view(T, -1), entropy.view(T, -1), value.view(T, -1)

    def column_bootstraps(self, data, last_obs, c):
        """V of the observation after the columns' last step ``[n]`` and V(final_obs) where
        truncated ``[T, n]`` (0 elsewhere), with the current network."""
        return self.bootstrap_value(last_obs[c]), self.final_values(data.truncated[:, c], data.final_obs[:, c])

    def explained_variance(self, batch) -> float:
        """Of the V-trace targets by the values they were computed against, over the minibatches."""
        vs, values = (torch.cat(parts) for parts in zip(*batch[2]))
        var = vs.var()
        return (1.0 - (vs - values).var() / var).item() if var > 0 else float("nan")
