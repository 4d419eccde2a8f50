"""CrossQ (Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity").

SAC without target networks: batch renormalisation in the critics and the actor, and the
current ``(s, a)`` and next ``(s', a')`` pairs through the critics in ONE joint forward, so
the batch statistics are those of their mixture (the paper's point: separate forwards would
normalise ``(s', a')`` with statistics of ``(s, a)`` alone). Adam with beta1 0.5.

Modes of the renorm layers, as in the paper's code and sb3-contrib 2.9 (``crossq.py``):

* critic update: the next action from the actor in eval mode (running statistics, nothing
  updated); the joint critic forward in train mode (batch statistics; running ones move);
  the target is that forward's next half, detached;
* actor update: the actor in train mode (its statistics move), the critics in eval mode;
* acting (``explore``, ``act``, evaluation): eval mode.

Batch statistics depend on the whole batch, so gradient workers (which see shards) are refused."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.actors.normed import RenormCritics, RenormSquashedGaussianActor
from corral.algos.sac import SAC, SACConfig
from corral.config import option
from corral.errors import UserError
from corral.nets import is_image_space
from corral.optim import FlatAdam


@dataclass
class CrossQConfig(SACConfig):
    lr: float = option(1e-3, "Adam learning rate", gt=0)
    policy_delay: int = option(3, "actor updates every this many critic updates", ge=1)
    critic_hidden: tuple[int, ...] | None = option((1024, 1024), "critic hidden sizes (None: hidden; paper 2048)",
                                                   ge=1)
    adam_beta1: float = option(0.5, "Adam beta1 of the actor and critics (the paper: 0.5)", ge=0, lt=1)
    bn_momentum: float = option(0.01, "batch renorm running-statistics momentum", gt=0, le=1)
    bn_eps: float = option(1e-3, "batch renorm epsilon", gt=0)
    bn_warmup: int = option(100_000, "training forwards of plain batch norm before renorm's r, d apply", ge=0)
    r_max: float = option(3.0, "batch renorm clip of r to [1/r_max, r_max]", ge=1)
    d_max: float = option(5.0, "batch renorm clip of d to [-d_max, d_max]", ge=0)


class CrossQ(SAC):
    name = "crossq"
    Config = CrossQConfig
    networks = ("actor", "critics")  # no target network
    grad_sharding = None
    grad_sharding_note = "its loss reads the statistics of the whole batch (batch renorm)"

    def __init__(self, cfg: CrossQConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if is_image_space(obs_space):  # before the replay is sized for images
            raise UserError(f"crossq takes vector observations, got images {obs_space.shape}; use sac for pixels")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)

    def _renorm(self) -> dict:
        cfg = self.cfg
        return dict(momentum=cfg.bn_momentum, eps=cfg.bn_eps, warmup=cfg.bn_warmup, r_max=cfg.r_max, d_max=cfg.d_max)

    def make_actor(self):
        cfg = self.cfg
        return RenormSquashedGaussianActor(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                           cfg.normalize_obs, **self._renorm())

    def make_critics(self, actor):
        cfg = self.cfg
        return RenormCritics(actor.enc.dim, actor.box.dim, cfg.n_critics, tuple(cfg.critic_hidden or cfg.hidden),
                             cfg.activation, **self._renorm())

    def _optimizer(self, params, lr):
        if not self.learns:
            return None
        return FlatAdam(params, lr=lr, betas=(self.cfg.adam_beta1, 0.999), eps=self.cfg.adam_eps,
                         max_grad_norm=self.cfg.max_grad_norm)

    def critic_loss(self, batch, obs, action, alpha, noise):
        B = obs.shape[0]
        with torch.no_grad():
            next_obs = self.actor.enc(batch.next_obs)
            next_action, next_logp = self.actor(next_obs, noise=noise["next"])  # eval mode
        # one joint forward in train mode: batch statistics of the (s, a) and (s', a') mixture
        q_all = self.critics(torch.cat([obs, next_obs]), torch.cat([action, next_action]), train=True)
        q, next_q = q_all[:, :B], q_all[:, B:].detach()
        target = batch.reward + batch.discount * (next_q.min(0).values - alpha * next_logp)
        td = q - target
        sq = td.square() * batch.weights if self.cfg.prioritized else td.square()
        loss = 0.5 * sq.mean(1).sum()
        return loss, q.detach(), (td.detach().abs().max(0).values if self.cfg.prioritized else None)

    def actor_action(self, obs, noise):
        return self.actor(obs, noise=noise, train=True)

    def actor_q(self, obs_view, new_action, noise):
        return self.critics(obs_view, new_action).min(0).values  # eval mode

    def after_step(self, stats):
        """No target network to move."""
