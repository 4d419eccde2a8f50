"""Soft Actor-Critic for discrete actions (Christodoulou 2019, "Soft Actor-Critic for
Discrete Action Settings"): a categorical policy, twin Q(s, .) critics, and every
expectation over the policy taken exactly, as a sum over the actions, instead of by
sampling. SAC with its networks, its explore and its loss replaced; the critics, targets,
temperature, policy delay and checkpointed state are SAC's.

With pi = pi(. | s), Q_min = min_i Q_i, and alpha the temperature:

* critic target: ``r + discount * sum_a pi(a|s') [min_i Q_targ_i(s', a) - alpha log pi(a|s')]``;
* actor loss: ``sum_a pi(a|s) [alpha log pi(a|s) - Q_min(s, a)]`` (critics detached: the
  exact expectation needs no reparameterization, so no gradient goes through a critic);
* temperature loss: ``log_alpha * (H(pi(. | s)) - target_entropy)``, averaged, with
  ``target_entropy = target_entropy_ratio * log|A|`` by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import torch

from corral.actors.categorical import CategoricalActor, DiscreteCritics
from corral.algos.base import Action
from corral.algos.sac import SAC, SACConfig
from corral.config import option
from corral.errors import UserError


@dataclass
class SACDiscreteConfig(SACConfig):
    target_entropy_ratio: float = option(
        0.5, "entropy target as a fraction of the uniform policy's log|A| (the paper's 0.98 keeps a 2-action "
        "policy near uniform)", ge=0, le=1)
    target_entropy: float | None = option(None, "entropy target in nats (None: target_entropy_ratio * log|A|)")


class SACDiscrete(SAC):
    name = "sac_discrete"
    Config = SACDiscreteConfig

    @staticmethod
    def check_action_space(act_space) -> None:
        if not isinstance(act_space, gym.spaces.Discrete):
            raise UserError(f"sac_discrete needs a Discrete action space, got {act_space}; use sac for Box actions")

    def default_target_entropy(self) -> float:
        return self.cfg.target_entropy_ratio * math.log(self.actor.n)

    def make_actor(self) -> torch.nn.Module:
        cfg = self.cfg
        return CategoricalActor(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.normalize_obs)

    def make_critics(self, actor) -> torch.nn.Module:
        """Q(s, .) on the actor's features; with a CNN in the actor's encoder (pixels, Dict
        with image parts), an encoder of the critics' own, trained by the critic loss."""
        cfg = self.cfg
        own = self.obs_space if actor.enc.trainable else None
        return DiscreteCritics(actor.enc.dim, actor.n, cfg.n_critics, tuple(cfg.hidden), cfg.activation, own)

    def explore(self, obs):
        if self.env_steps < self.cfg.learning_starts:
            action = torch.randint(self.actor.n, (obs.shape[0],), generator=self.rng["noise"], device=self.device)
        else:
            action = self.actor.sample(self.actor(self.actor.enc(obs)), self.rng["action"])
        return action, Action(action)

    def draw_noise(self, batch_size):
        return {}  # every expectation over actions is a sum: a gradient step draws nothing

    @staticmethod
    def soft_target(next_log_probs: torch.Tensor, next_q: torch.Tensor, reward: torch.Tensor,
                    discount: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``r + discount * sum_a pi(a|s') [Q(s', a) - alpha log pi(a|s')]``; ``next_q``: the
        min over the target critics, ``[B, actions]``."""
        next_v = (next_log_probs.exp() * (next_q - alpha * next_log_probs)).sum(-1)
        return reward + discount * next_v

    @staticmethod
    def actor_loss(log_probs: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``sum_a pi(a|s) [alpha log pi(a|s) - Q(s, a)]`` averaged over the rows (``q`` detached)."""
        return (log_probs.exp() * (alpha * log_probs - q)).sum(-1).mean()

    def temperature_loss(self, entropy: torch.Tensor) -> torch.Tensor:
        """Its gradient in log_alpha is mean(H) - target: alpha falls above the target, rises below."""
        return (self.log_alpha * (entropy - self.target_entropy)).mean()

    def phases(self, batch, noise, shared=None):
        cfg = self.cfg
        enc, view = self.actor.enc, self.critics.view
        obs = enc(batch.obs)
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_obs = enc(batch.next_obs)
            next_q = self.critics_target(view(batch.next_obs, next_obs)).min(0).values
            target = self.soft_target(self.actor(next_obs), next_q, batch.reward, batch.discount, alpha)
        n = self.critics.n
        action = batch.action.long().reshape(1, -1, 1).expand(n, -1, 1)
        q = self.critics(view(batch.obs, obs)).gather(-1, action).squeeze(-1)  # [n, B]
        td = q - target
        sq = td.square() * batch.weights if cfg.prioritized else td.square()  # uniform weights are all 1
        critic_loss = 0.5 * sq.mean(1).sum()
        yield self.critic_opt, critic_loss
        stats = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean(), "alpha": alpha}

        if self._actor_step():
            log_probs = self.actor(obs)
            with torch.no_grad():  # the critics as the critic step left them
                q_all = self.critics(view(batch.obs, obs.detach())).min(0).values
            actor_loss = self.actor_loss(log_probs, q_all, alpha)
            yield self.actor_opt, actor_loss
            entropy = -(log_probs.detach().exp() * log_probs.detach()).sum(-1)
            stats["actor_loss"] = actor_loss.detach()
            stats["entropy"] = entropy.mean()
            if self.auto_alpha:
                yield self.alpha_opt, self.temperature_loss(entropy)
        return stats, (td.detach().abs().max(0).values if cfg.prioritized else None)
