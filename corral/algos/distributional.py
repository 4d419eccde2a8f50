"""Distributional DQN: C51 (Bellemare et al. 2017), QR-DQN (Dabney et al. 2018a) and IQN
(Dabney et al. 2018b), each a DQN whose network returns a distribution per action and
whose loss compares it with the n-step, discounted target distribution. Double, dueling,
n-step, prioritized replay and noisy nets are DQN's flags; Rainbow (Hessel et al. 2018) is
C51 with all of them on (the ``rainbow`` preset).

The math lives in three functions with known-answer tests: ``categorical_projection``
(C51's target on the fixed support), ``quantile_huber_loss`` (QR-DQN and IQN) and
``ImplicitQNetwork.embedding`` (IQN's cosine embedding). Each ``phases`` is the readable step;
the fast paths that replace parts of it at the presets (the quantile Huber loss with its
gradient in the forward, QR-DQN's step without autograd) live in ``corral/kernels/``, each
registered against the code here it must equal (``tests/test_kernels.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from corral.actors.distributional import (
    CategoricalQNetwork,
    ImplicitQNetwork,
    QuantileQNetwork,
)
from corral.algos.dqn import DQN, DQNConfig
from corral.config import option
from corral.errors import UserError
from corral.kernels.direct import quantile_direct_step
from corral.kernels.quantile import QuantileHuber
from corral.kernels.registry import Replaces


def categorical_projection(next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                           support: torch.Tensor) -> torch.Tensor:
    """Project the target distribution ``r + discount * z`` (probabilities ``next_probs``
    ``[B, K]`` on atoms ``support`` ``[K]``) back onto the support: each shifted atom's
    mass goes to its two neighbours in proportion to closeness; a target that lands on an
    atom keeps all its mass there, one beyond either end goes to that end. Mass is
    conserved: every row of the result sums to the row's input mass.

    ``discount`` is ``gamma^n`` (0 after a termination, so the target is the reward
    alone; a truncation bootstraps like any other step)."""
    K = support.shape[0]
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (K - 1)
    tz = (reward.unsqueeze(-1) + discount.unsqueeze(-1) * support).clamp(v_min, v_max)
    # Fractional atom index in [0, K - 1]. Clamped again: rounding can put an end target a hair
    # outside (b = 50.000004 for 51 atoms on [-5, 100]; CUDA's division by K - 1 does it on
    # [-10, 10]), and its ceil would then index past the last atom.
    b = ((tz - v_min) / dz).clamp(0, K - 1)
    lower, upper = b.floor().long(), b.ceil().long()
    # on an atom, lower == upper: all the mass to it (the weights below would both be 0)
    w_lower = (upper.to(b.dtype) - b) + (lower == upper).to(b.dtype)
    w_upper = b - lower.to(b.dtype)
    out = torch.zeros_like(next_probs)
    out.scatter_add_(-1, lower, next_probs * w_lower)
    out.scatter_add_(-1, upper, next_probs * w_upper)
    return out


def quantile_huber_loss(pred: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa: float) -> torch.Tensor:
    """Per-sample quantile Huber loss, ``[B]``: ``sum_i mean_j rho^kappa_{tau_i}(T_j - theta_i)``
    with ``rho^kappa_tau(u) = |tau - 1{u < 0}| L_kappa(u) / kappa``, ``L_kappa`` the Huber loss
    (``kappa = 0``: ``|tau - 1{u < 0}| |u|``, plain quantile regression).

    ``pred`` ``[B, N]`` are the predicted quantiles at fractions ``taus`` (``[B, N]`` or
    ``[N]``), ``target`` ``[B, N']`` the target samples."""
    u = target.unsqueeze(-2) - pred.unsqueeze(-1)  # [B, N, N']: u_ij = T_j - theta_i
    if taus.dim() == 1:
        taus = taus.expand_as(pred)
    weight = (taus.unsqueeze(-1) - (u.detach() < 0).to(u.dtype)).abs()
    if kappa == 0:
        rho = weight * u.abs()
    else:
        au = u.abs()
        huber = torch.where(au <= kappa, 0.5 * u.square(), kappa * (au - 0.5 * kappa))
        rho = weight * huber / kappa
    return rho.mean(-1).sum(-1)


def quantile_huber(pred: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa: float) -> torch.Tensor:
    """``quantile_huber_loss``'s values and gradient, by the kernel ``QuantileHuber``
    (``corral/kernels/quantile.py``) where kappa > 0."""
    if kappa > 0:
        return QuantileHuber.apply(pred, target.detach(), taus, kappa)
    return quantile_huber_loss(pred, target, taus, 0.0)


class DistributionalDQN(DQN):
    """What the three share: the next action (online net's Q with ``double``, else the
    target's), the weighted loss, and priorities from the per-sample loss."""

    def shared_targets(self, batch):
        # the target net's next-state outputs, once per update (not with noise: it is redrawn every step)
        return None if self.cfg.noisy else self.over_distinct(self.target_out, batch)

    def target_out(self, obs):
        return self.target.out(obs, norm=self.actor.enc.norm)

    def online(self, batch):
        """The online net's outputs ``[B, A, K]`` for ``batch.obs`` and, with ``double``, its
        (detached) expected Q of ``batch.next_obs`` from the same forward pass (else None)."""
        net, B = self.actor, batch.obs.shape[0]
        if not self.cfg.double:
            return net.out(batch.obs), None
        out = net.out(torch.cat([batch.obs, batch.next_obs]))
        return out[:B], net.expectation(out[B:].detach())

    def next_action(self, next_q_online: torch.Tensor | None, next_q_target: torch.Tensor) -> torch.Tensor:
        return (next_q_online if self.cfg.double else next_q_target).argmax(-1)

    def finish(self, per_sample: torch.Tensor, batch, q: torch.Tensor):
        """The step's loss (importance-weighted with PER), its stats, and its priorities: the
        per-sample distributional loss, as in Rainbow."""
        cfg = self.cfg
        loss = (per_sample * batch.weights).mean() if cfg.prioritized else per_sample.mean()
        return loss, {"q_loss": loss.detach(), "q_mean": q.detach().mean()}, (
            per_sample.detach() if cfg.prioritized else None)


@dataclass
class DistributionalConfig(DQNConfig):
    """DQN's options less ``loss``: each distributional loss is its own (C51's cross-entropy,
    the quantile Huber loss at ``kappa``), so DQN's huber / mse choice is taken out (a ClassVar
    is not a dataclass field: the key is refused as unknown)."""

    loss: ClassVar[None] = None


@dataclass
class C51Config(DistributionalConfig):
    n_atoms: int = option(51, "atoms of the categorical return distribution", ge=2)
    v_min: float = option(-10.0, "lowest atom (returns below it are projected onto it)")
    v_max: float = option(10.0, "highest atom (returns above it are projected onto it)")


class C51(DistributionalDQN):
    name = "c51"
    Config = C51Config

    def __init__(self, cfg: C51Config, *args, **kw):
        if not cfg.v_min < cfg.v_max:
            raise UserError(f"c51: v_min ({cfg.v_min}) must be below v_max ({cfg.v_max})")
        super().__init__(cfg, *args, **kw)

    def make_q_network(self):
        return CategoricalQNetwork(self.obs_space, int(self.act_space.n), self.cfg.n_atoms, self.cfg.v_min,
                                   self.cfg.v_max, **self.net_kwargs())

    def phases(self, batch, noise, next_logits_target=None):
        net = self.actor
        logits, next_q_online = self.online(batch)
        rows = torch.arange(logits.shape[0], device=logits.device)
        with torch.no_grad():
            if next_logits_target is None:
                next_logits_target = self.target_out(batch.next_obs)
            next_probs = next_logits_target.softmax(-1)
            a = self.next_action(next_q_online, (next_probs * net.support).sum(-1))
            target = categorical_projection(next_probs[rows, a], batch.reward, batch.discount, net.support)
        chosen = logits[rows, batch.action.long()]  # [B, K]
        per_sample = -(target * chosen.log_softmax(-1)).sum(-1)  # cross-entropy
        loss, stats, td = self.finish(per_sample, batch, (chosen.detach().softmax(-1) * net.support).sum(-1))
        yield self.optimizer, loss
        return stats, td


@dataclass
class QRDQNConfig(DistributionalConfig):
    n_quantiles: int = option(200, "quantiles per action (sb3-contrib's default)", ge=1)
    kappa: float = option(1.0, "quantile Huber threshold (0: plain quantile regression loss)", ge=0)
    init: Literal["orthogonal", "torch"] = option(
        "orthogonal", "MLP weight init: orthogonal with gain sqrt(2), or torch's default (sb3-contrib's)")


class QRDQN(DistributionalDQN):
    name = "qrdqn"
    Config = QRDQNConfig

    def __init__(self, cfg: QRDQNConfig, *args, **kw):
        super().__init__(cfg, *args, **kw)
        N = cfg.n_quantiles
        self.taus = (torch.arange(N, device=self.device, dtype=torch.float32) + 0.5) / N  # (2i + 1) / 2N

    def make_q_network(self):
        return QuantileQNetwork(self.obs_space, int(self.act_space.n), self.cfg.n_quantiles, init=self.cfg.init,
                                **self.net_kwargs())

    def shared_targets(self, batch):
        # Without double the TD targets depend on the target net alone, which an update does not
        # change: all of them once per update (with double, the target net's next-state quantiles).
        if self.cfg.noisy or self.cfg.double:
            return super().shared_targets(batch)
        return self.quantile_target(batch, None, None)

    def td_targets(self, batch, shared, next_q_online):
        """The TD targets ``[B, N]``; ``shared`` is ``shared_targets``' rows for this batch, or None."""
        if shared is not None and not self.cfg.double:
            return shared
        return self.quantile_target(batch, shared, next_q_online)

    def phases(self, batch, noise, shared=None):
        quantiles, next_q_online = self.online(batch)
        with torch.no_grad():
            target = self.td_targets(batch, shared, next_q_online)
        # [B, N]; a gather (its backward a scatter) rather than indexing (an accumulating index_put)
        chosen = quantiles.gather(1, self.chosen_index(batch)).squeeze(1)
        per_sample = quantile_huber(chosen, target, self.taus, self.cfg.kappa)
        loss, stats, td = self.finish(per_sample, batch, chosen.detach())  # q_mean: over the quantiles too
        yield self.optimizer, loss
        return stats, td

    def quantile_target(self, batch, next_target, next_q_online):
        """``r + discount * theta_j(s', a')`` ``[B, N]``, ``a'`` greedy on the mean of the
        target net's quantiles (the online net's Q with ``double``)."""
        if next_target is None:
            next_target = self.over_distinct(self.target_out, batch)
        a = self.next_action(next_q_online, next_target.mean(-1))
        rows = torch.arange(next_target.shape[0], device=next_target.device)
        return batch.reward.unsqueeze(-1) + batch.discount.unsqueeze(-1) * next_target[rows, a]

    def chosen_index(self, batch):
        """``gather`` index ``[B, 1, N]`` of the taken actions' quantiles in ``[B, A, N]``."""
        a = batch.action
        return (a if a.dtype == torch.long else a.long()).view(-1, 1, 1).expand(-1, 1, self.cfg.n_quantiles)

    # --- the fast path: ``corral.kernels.direct.quantile_direct_step`` takes this step without
    # autograd (DQN's ``train_step`` drives it), bit for bit ``phases`` (tests/test_kernels.py); a
    # subclass with its own ``phases`` runs that instead
    direct = Replaces(quantile_direct_step, phases=phases)

    def direct_allowed(self) -> bool:
        """A plain MLP net (no dueling, noisy layers or CNN: ``ZNetwork.chain``), kappa > 0, no double."""
        cfg = self.cfg
        return not (cfg.double or cfg.noisy or cfg.kappa <= 0)


@dataclass
class IQNConfig(DistributionalConfig):
    n_taus: int = option(64, "N: fractions sampled for the online quantiles of a gradient step", ge=1)
    n_target_taus: int = option(64, "N': fractions sampled for the target quantiles", ge=1)
    n_action_taus: int = option(32, "K: fractions a greedy action averages over (acting and next actions)", ge=1)
    n_cos: int = option(64, "cosine basis functions of the fraction embedding", ge=1)
    kappa: float = option(1.0, "quantile Huber threshold (0: plain quantile regression loss)", ge=0)
    risk: Literal["neutral", "cvar"] = option("neutral", "acting distortion: risk-neutral, or CVaR at risk_eta")
    risk_eta: float = option(1.0, "CVaR level: act on the mean of the lowest eta of the returns", gt=0, le=1)


class IQN(DistributionalDQN):
    name = "iqn"
    Config = IQNConfig

    def make_q_network(self):
        cfg = self.cfg
        eta = cfg.risk_eta if cfg.risk == "cvar" else 1.0
        return ImplicitQNetwork(self.obs_space, int(self.act_space.n), cfg.n_cos, cfg.n_action_taus, eta,
                                **self.net_kwargs())

    def shared_targets(self, batch):
        return None  # the target quantiles depend on each step's sampled fractions

    def greedy(self, obs):
        # acting samples its K fractions from the run's own stream for them
        return self.actor.q(obs, generator=self.rng["tau"]).argmax(-1)

    def draw_noise(self, batch_size):
        noise = super().draw_noise(batch_size)
        g, dev, cfg = self.rng["tau"], self.device, self.cfg
        noise["taus"] = torch.rand(batch_size, cfg.n_taus, generator=g, device=dev)
        noise["target_taus"] = torch.rand(batch_size, cfg.n_target_taus, generator=g, device=dev)
        noise["action_taus"] = self.actor.acting_taus(batch_size, dev, g)
        return noise

    def phases(self, batch, noise, shared=None):
        B = batch.obs.shape[0]
        net, taus = self.actor, noise["taus"]
        quantiles = net.quantiles(batch.obs, taus)  # [B, N, A]
        rows = torch.arange(B, device=quantiles.device)
        with torch.no_grad():
            online = net.q(batch.next_obs, taus=noise["action_taus"]) if self.cfg.double else None
            tnorm = net.enc.norm
            a = self.next_action(online, self.target.q(batch.next_obs, tnorm, taus=noise["action_taus"]))
            next_z = self.target.quantiles(batch.next_obs, noise["target_taus"], tnorm)[rows, :, a]  # [B, N']
            target = batch.reward.unsqueeze(-1) + batch.discount.unsqueeze(-1) * next_z
        chosen = quantiles[rows, :, batch.action.long()]  # [B, N]
        per_sample = quantile_huber(chosen, target, taus, self.cfg.kappa)
        loss, stats, td = self.finish(per_sample, batch, chosen.detach())  # q_mean: over the quantiles too
        yield self.optimizer, loss
        return stats, td


# Rainbow is C51 with every flag on; n-step 3 and the PER exponents are the paper's.
RAINBOW_OVERRIDES = {"double": True, "dueling": True, "prioritized": True, "n_step": 3, "noisy": True,
                     "per_alpha": 0.5}
