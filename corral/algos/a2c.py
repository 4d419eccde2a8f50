"""A2C (Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning", the
synchronous variant) and the policy-gradient pieces REINFORCE shares (``corral.algos.reinforce``).

A member of the on-policy family (``corral.algos.onpolicy``): its actor-critic (separate
policy and value MLPs), rollout storage, ``explore``/``observe``, GAE and update loop, with the
loop's own batcher (one minibatch that is the whole rollout, once), so gradient workers
(``scheme.grad_workers``) and collectors work as for PPO. A2C's parts are its loss (the plain
policy gradient with the value regression, no ratio and no clipping) and its optimizer
(RMSprop with SB3's ``alpha=0.99, eps=1e-5`` by default). ``gae_lambda=1.0`` gives SB3's n-step returns: every step's return runs to the
rollout's end and bootstraps from V there (V(final_obs) where an episode was truncated,
0 where it terminated).

Shared optimizer: one RMSprop over the policy and value parameters. They are separate
weights (``ActorCritic``'s two MLPs; only an image encoder is shared), so ``pg_loss`` and
``v_loss`` reach disjoint parameters and RMSprop's update is per coordinate; what couples
them is the global gradient-norm clip, which scales both gradients by one factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from corral.algos.onpolicy import OnPolicy, OnPolicyConfig, actor_option, make_user_actor, normalized
from corral.algos.sde import SDEConfig
from corral.config import option
from corral.optim import FlatAdam, FlatRMSprop


@dataclass
class PolicyGradientConfig(OnPolicyConfig):
    """Options A2C and REINFORCE share."""

    lr: float = option(7e-4, "learning rate", gt=0)
    normalize_advantage: bool = option(False, "normalize the advantages over each batch")
    ent_coef: float = option(0.0, "entropy bonus coefficient", ge=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = option(0.5, "global gradient norm clip", gt=0)
    optimizer: Literal["rmsprop", "adam"] = option("rmsprop", "rmsprop (torch's, as SB3) or adam")
    rms_alpha: float = option(0.99, "RMSprop smoothing constant alpha", ge=0, lt=1)
    eps: float = option(1e-5, "RMSprop / Adam epsilon (SB3's rms_prop_eps)", gt=0)
    actor: str | None = actor_option()


@dataclass
class A2CConfig(SDEConfig, PolicyGradientConfig):
    n_steps: int = option(5, "env steps per env per rollout (the n of n-step returns)", ge=1)
    gae_lambda: float = option(1.0, "GAE lambda (1.0: n-step returns, as SB3)", ge=0, le=1)
    normalize_reward: bool = option(False, "scale rewards by the running std of the discounted return")
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)


class PolicyGradient(OnPolicy):
    """The parts A2C and REINFORCE share: the user's ``actor`` class, the optimizer and the
    policy-gradient loss; the batch is the loop's (one minibatch that is the whole rollout)."""

    grad_sharding = "minibatches"
    STATS = ("pg_loss", "v_loss", "entropy")

    def make_actor(self) -> torch.nn.Module:
        """The user's ``actor`` class, else ``ActorCritic`` (``OnPolicy.make_actor``)."""
        if self.cfg.actor is not None:
            return make_user_actor(self.cfg, self.obs_space, self.act_space, self.name)
        return super().make_actor()

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

    def minibatch_loss(self, obs, actions, log_probs, values, adv, ret, param, normalize_adv: bool):
        """The policy-gradient loss: ``-A log pi(a|s)``, the value regression and the entropy
        bonus (gradient workers call this too; ``log_probs``, ``values`` and ``param`` are unused)."""
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


class A2C(PolicyGradient):
    name = "a2c"
    Config = A2CConfig

    def reward_clip(self) -> float | None:
        return self.cfg.reward_clip if self.cfg.normalize_reward else None
