"""A2C (Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning", the
synchronous variant) and the policy-gradient pieces REINFORCE shares (``corral.algos.reinforce``).

A small diff over PPO: the same actor-critic (separate policy and value MLPs), rollout
storage, ``explore``/``observe`` and update loop (``PPO.update``: schedules,
``prepare_batch`` with GAE, ``train_minibatches``, ``finish``), run as one epoch over one
minibatch that is the whole rollout, so gradient workers (``scheme.grad_workers``) and
collectors work as for PPO. What differs is the loss (the plain policy gradient, no ratio
and no clipping) and the optimizer (RMSprop with SB3's ``alpha=0.99, eps=1e-5`` by
default). ``gae_lambda=1.0`` gives SB3's n-step returns: every step's return runs to the
rollout's end and bootstraps from V there (V(final_obs) where an episode was truncated,
0 where it terminated).

Shared optimizer: one RMSprop over the policy and value parameters. They are separate
weights (``ActorCritic``'s two MLPs; only an image encoder is shared), so ``pg_loss`` and
``v_loss`` reach disjoint parameters and RMSprop's update is per coordinate; what couples
them is the global gradient-norm clip, which scales both gradients by one factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from corral.algos.ppo import PPO, actor_option, features_option, normalized, storage_option
from corral.config import Activation, Schedule, option
from corral.optim import FlatAdam, FlatRMSprop


@dataclass
class PolicyGradientConfig:
    """Options A2C and REINFORCE share."""

    lr: float = option(7e-4, "learning rate", gt=0)
    lr_schedule: Schedule = option("constant", "constant, or linear (anneal to 0 over the run)")
    gamma: float = option(0.99, "discount factor", ge=0, le=1)
    normalize_advantage: bool = option(False, "normalize the advantages over each batch")
    ent_coef: float = option(0.0, "entropy bonus coefficient", ge=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = option(0.5, "global gradient norm clip", gt=0)
    optimizer: Literal["rmsprop", "adam"] = option("rmsprop", "rmsprop (torch's, as SB3) or adam")
    rms_alpha: float = option(0.99, "RMSprop smoothing constant alpha", ge=0, lt=1)
    eps: float = option(1e-5, "RMSprop / Adam epsilon (SB3's rms_prop_eps)", gt=0)
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the policy and value MLPs", ge=1)
    activation: Activation = option("tanh", "hidden activation: tanh, relu, elu, silu")
    log_std_init: float = option(0.0, "initial log std of the Gaussian policy (Box actions)")
    normalize_obs: bool = option(False, "running observation normalization (saved with the actor)")
    features: str | None = features_option()
    actor: str | None = actor_option()
    storage: str | None = storage_option()

    # PPO's loop reads these; in the policy-gradient family they are fixed, not options:
    # one epoch over one minibatch that is the whole batch, no clipping, no KL stop.
    n_epochs: ClassVar[int] = 1
    batch_size: ClassVar[int] = 0  # the whole rollout
    clip_range: ClassVar[float] = 0.0
    clip_schedule: ClassVar[str] = "constant"
    clip_range_vf: ClassVar[None] = None
    target_kl: ClassVar[None] = None


@dataclass
class A2CConfig(PolicyGradientConfig):
    n_steps: int = option(5, "env steps per env per rollout (the n of n-step returns)", ge=1)
    gae_lambda: float = option(1.0, "GAE lambda (1.0: n-step returns, as SB3)", ge=0, le=1)
    normalize_reward: bool = option(False, "scale rewards by the running std of the discounted return")
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)


class A2C(PPO):
    name = "a2c"
    Config = A2CConfig
    STATS = ("pg_loss", "v_loss", "entropy")
    KL = None  # no target-KL stop

    def make_optimizer(self):
        cfg = self.cfg
        if cfg.optimizer == "adam":
            return FlatAdam(self.actor.parameters(), lr=cfg.lr, eps=cfg.eps, max_grad_norm=cfg.max_grad_norm)
        return FlatRMSprop(self.actor.parameters(), lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.eps,
                           max_grad_norm=cfg.max_grad_norm)

    @property
    def value_coef(self) -> float:
        """Weight of ``v_loss`` in the loss (REINFORCE without a baseline: 0)."""
        return self.cfg.vf_coef

    def minibatch_loss(self, obs, actions, log_probs, values, adv, ret, clip: float, normalize_adv: bool):
        """The policy-gradient loss: ``-A log pi(a|s)``, the value regression and the entropy
        bonus (gradient workers call this too; ``log_probs``, ``values`` and ``clip`` are unused)."""
        cfg = self.cfg
        if normalize_adv:
            adv = normalized(adv)
        log_prob, entropy, value = self.actor.evaluate_actions(obs, actions)
        pg_loss = -(adv * log_prob).mean()
        v_loss = F.mse_loss(value, ret)
        entropy_loss = entropy.mean()
        loss = pg_loss - cfg.ent_coef * entropy_loss + self.value_coef * v_loss
        stats = torch.stack([pg_loss.detach(), v_loss.detach(), entropy_loss.detach()])
        return loss, stats

    def update(self, progress: float) -> dict[str, float]:
        stats = super().update(progress)
        del stats["clip_range"]  # there is none
        return stats
