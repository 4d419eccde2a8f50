"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: algorithms and applications"):
squashed Gaussian policy, twin critics as one batched module, automatic entropy tuning.

``use_sde``: gSDE's state-dependent exploration (``corral.algos.sde``) as SB3's SAC has it:
the actor is ``SDESquashedGaussianActor``; collection acts with each env's exploration matrix,
and each gradient step draws one matrix for the whole batch, shared by the target's next
action and the actor loss's sample (its ``theta = sigma * z`` carries the actor loss's gradient
to the learned std)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import gymnasium as gym
import torch

from corral.actors.offpolicy import SquashedGaussianActor
from corral.actors.sde import SDESquashedGaussianActor
from corral.algos.base import Action
from corral.algos.offpolicy import ActorCriticOffPolicy, OffPolicyConfig
from corral.algos.sde import SDEConfig, SDEExploration, sde_options_unused
from corral.config import option
from corral.errors import UserError
from corral.optim import FlatAdam


@dataclass
class SACConfig(SDEConfig, OffPolicyConfig):
    n_critics: int = option(2, "critics; targets use the min over them", ge=1)
    ent_coef: float | None = option(None, "fixed entropy coefficient alpha (None: tuned automatically)", ge=0)
    ent_coef_init: float = option(1.0, "initial alpha when tuned", gt=0)
    target_entropy: float | None = option(None, "entropy target (None: -action_dim)")
    actor_lr: float | None = option(None, "actor and alpha learning rate (None: same as lr)", gt=0)
    policy_delay: int = option(1, "actor updates every this many critic updates", ge=1)
    use_sde_at_warmup: bool = option(
        False, "gSDE: act with the policy's state-dependent noise before learning_starts too (else uniform actions)")
    log_std_init: float = option(-3.0, "gSDE: initial log std of the exploration matrix (the plain actor outputs "
                                       "its log std)")


class SAC(ActorCriticOffPolicy):
    name = "sac"
    Config = SACConfig

    networks = ("actor", "critics", "critics_target")
    optimizers = ("actor_opt", "critic_opt", "alpha_opt")
    free_params = ("log_alpha",)
    capturable = True

    def __init__(self, cfg: SACConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        self.check_action_space(act_space)
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.actor, self.critics = self._build(self.make_networks)
        self.sde = self._sde_exploration()
        if "critics_target" in self.networks:  # CrossQ declares none
            self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_opt = self._optimizer(self.actor.parameters(), cfg.actor_lr or cfg.lr)
        self.critic_opt = self._optimizer(self.critics.parameters(), cfg.lr)
        self.auto_alpha = cfg.ent_coef is None
        init = cfg.ent_coef_init if self.auto_alpha else cfg.ent_coef
        self.log_alpha = torch.tensor(math.log(init), device=device, requires_grad=self.auto_alpha)
        self.alpha_opt = (FlatAdam([self.log_alpha], lr=cfg.actor_lr or cfg.lr, eps=cfg.adam_eps)
                          if self.auto_alpha and self.learns else None)
        self.target_entropy = float(cfg.target_entropy if cfg.target_entropy is not None
                                    else self.default_target_entropy())

    @staticmethod
    def check_action_space(act_space) -> None:
        if not isinstance(act_space, gym.spaces.Box):
            raise UserError(f"sac needs a Box action space, got {act_space}; use sac_discrete, dqn or ppo for Discrete")

    def default_target_entropy(self) -> float:
        return -self.actor.box.dim

    def make_actor(self) -> torch.nn.Module:
        cfg = self.cfg
        if cfg.use_sde:
            try:
                return SDESquashedGaussianActor(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                                cfg.normalize_obs, cfg.log_std_init, cfg.full_std, cfg.use_expln)
            except ValueError as e:
                raise UserError(f"{self.name}.use_sde: {e}") from None
        return SquashedGaussianActor(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                     cfg.normalize_obs)

    def _sde_exploration(self) -> SDEExploration | None:
        """gSDE's per-env exploration matrices, redrawn at each rollout's start (``train_freq``)."""
        cfg = self.cfg
        if not cfg.use_sde:
            sde_options_unused(self.name, (("sde_sample_freq", cfg.sde_sample_freq, -1),
                                           ("use_sde_at_warmup", cfg.use_sde_at_warmup, False),
                                           ("log_std_init", cfg.log_std_init, -3.0), ("full_std", cfg.full_std, True),
                                           ("use_expln", cfg.use_expln, False)))
            return None
        if not isinstance(self.actor, SDESquashedGaussianActor):
            raise UserError(f"{self.name}.use_sde: gSDE is built into SAC's and TQC's actor; {self.name} builds "
                            "another one; set use_sde=false")
        sde = self.actor.sde
        return SDEExploration(sde.latent_dim, sde.act_dim, self.num_envs, cfg.train_freq, cfg.sde_sample_freq,
                              self.device)

    def explore(self, obs):
        if self.sde is not None:
            return self._explore_sde(obs)
        box = self.actor.box
        if self.env_steps < self.cfg.learning_starts:
            unit = torch.rand(obs.shape[0], box.dim, generator=self.rng["noise"], device=self.device) * 2 - 1
        else:
            unit, _ = self.actor(self.actor.enc(obs), self.rng["action"], log_prob=False)
        env_action = box.to_env(unit)
        return env_action, Action(env_action)

    def _explore_sde(self, obs):
        """Acting with each env's exploration matrix; the matrices' cadence runs in the warm-up
        too, as SB3's rollouts do, whether or not the warm-up acts with them."""
        box, cfg = self.actor.box, self.cfg
        z = self.sde.next(self.actor.sde, obs.shape[0], self.rng["action"])
        if self.env_steps < cfg.learning_starts and not cfg.use_sde_at_warmup:
            unit = torch.rand(obs.shape[0], box.dim, generator=self.rng["noise"], device=self.device) * 2 - 1
        else:
            unit, _ = self.actor(self.actor.enc(obs), noise=z, log_prob=False)
        env_action = box.to_env(unit)
        return env_action, Action(env_action)

    def _actor_step(self) -> bool:
        return (self.grad_steps + 1) % self.cfg.policy_delay == 0

    def draw_noise(self, batch_size):
        # as the step uses them: the next action's sample, then the new action's (actor steps only)
        if self.sde is not None:
            # one exploration matrix for the whole step (SB3's reset_noise per gradient step), a row view
            # each so a gradient worker's shard of the rows carries it
            z = self.actor.sde.draw(None, self.rng["noise"]).expand(batch_size, -1, -1)
            return {"next": z, "new": z} if self._actor_step() else {"next": z}
        shape = (batch_size, self.actor.box.dim)
        noise = {"next": torch.randn(shape, generator=self.rng["noise"], device=self.device)}
        if self._actor_step():
            noise["new"] = torch.randn(shape, generator=self.rng["noise"], device=self.device)
        return noise

    # --- the step, in hooks a variant overrides (REDQ: the target's subset, the actor's mean;
    # TQC: quantile critics; CrossQ: one joint forward, no target)
    def target_q(self, next_obs_view: torch.Tensor, next_action: torch.Tensor, noise) -> torch.Tensor:
        """The next state's value before the entropy term, ``[B]``: the min over the target critics."""
        return self.critics_target(next_obs_view, next_action).min(0).values

    def critic_loss(self, batch, obs, action, alpha, noise):
        """(loss, Q for the metrics, |TD error| per row for PER or None)."""
        enc, view = self.actor.enc, self.critics.view
        with torch.no_grad():
            next_obs = enc(batch.next_obs)
            next_action, next_logp = self.actor(next_obs, noise=noise["next"])
            next_q = self.target_q(view(batch.next_obs, next_obs), next_action, noise) - alpha * next_logp
            target = batch.reward + batch.discount * next_q
        q = self.current_q(view(batch.obs, obs), action, noise)
        td = q - target
        sq = td.square() * batch.weights if self.cfg.prioritized else td.square()  # uniform weights are all 1
        loss = 0.5 * sq.mean(1).sum()
        return loss, q.detach(), (td.detach().abs().max(0).values if self.cfg.prioritized else None)

    def current_q(self, obs_view: torch.Tensor, action: torch.Tensor, noise) -> torch.Tensor:
        """The critics' values of the batch's actions, ``[n, B]``."""
        return self.critics(obs_view, action)

    def actor_action(self, obs: torch.Tensor, noise: torch.Tensor):
        """The actor's (action, log-prob) for the actor loss."""
        return self.actor(obs, noise=noise)

    def actor_q(self, obs_view: torch.Tensor, new_action: torch.Tensor, noise) -> torch.Tensor:
        """What the actor maximises, ``[B]``: the min over the critics."""
        return self.critics(obs_view, new_action).min(0).values

    def phases(self, batch, noise, shared=None):
        obs = self.actor.enc(batch.obs)
        action = self.actor.box.to_unit(batch.action)
        alpha = self.log_alpha.detach().exp()
        critic_loss, q, td = self.critic_loss(batch, obs, action, alpha, noise)
        yield self.critic_opt, critic_loss
        stats = {"critic_loss": critic_loss.detach(), "q_mean": q.mean(), "alpha": alpha}

        if self._actor_step():
            new_action, logp = self.actor_action(obs, noise["new"])
            # Critic weights are frozen for this loss: they only carry gradient to the action.
            critic_params = self.frozen(self.critics, self.__dict__.setdefault("_critic_params", []))
            for p in critic_params:
                p.requires_grad_(False)
            q_new = self.actor_q(self.critics.view(batch.obs, obs), new_action, noise)
            actor_loss = (alpha * logp - q_new).mean()
            try:
                yield self.actor_opt, actor_loss
            finally:
                for p in critic_params:
                    p.requires_grad_(True)
            stats["actor_loss"] = actor_loss.detach()
            stats["entropy"] = -logp.detach().mean()
            if self.auto_alpha:
                alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
                yield self.alpha_opt, alpha_loss
        return stats, td

    def _target_step(self) -> bool:
        return (self.grad_steps + 1) % self.cfg.target_update_interval == 0

    def graph_key(self):
        return self._actor_step(), self._target_step()

    def after_step(self, stats):
        if self._target_step():
            self.polyak(self.critics_target, self.critics, self.cfg.tau, self._pairs)

    def extra_state(self):
        state = super().extra_state()
        if self.sde is not None:
            state["sde"] = self.sde.state_dict()
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        if self.sde is not None and "sde" in state:
            self.sde.load_state_dict(state["sde"])
