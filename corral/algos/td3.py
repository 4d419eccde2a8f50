"""TD3 (Fujimoto et al. 2018) and DDPG (Lillicrap et al. 2016) as one file.

TD3 = DDPG + twin critics (min of two targets) + delayed actor updates + target
policy smoothing. DDPG is the preset with one critic, no delay and no smoothing.
The critics are one batched module (``Critics``), so the twin costs one forward.

Exploration noise (``exploration_noise_type``) is Gaussian, independent per step, or SB3's
Ornstein-Uhlenbeck process per env column, ``x <- x + theta (0 - x) dt + sigma sqrt(dt) N(0, 1)``
(theta 0.15, dt 1e-2, sigma ``exploration_noise``), drawn from the ``noise`` stream, back to 0
where an env's episode starts and kept in the checkpoint. SB3's process runs through the warm-up
too (it adds its noise to the random actions); here it is stepped there, the warm-up's actions
staying uniform, so the process is where SB3's is when learning starts.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import torch

from corral.actors.offpolicy import DeterministicActor
from corral.algos.base import Action
from corral.algos.offpolicy import ActorCriticOffPolicy, OffPolicyConfig
from corral.config import option
from corral.errors import UserError


@dataclass
class TD3Config(OffPolicyConfig):
    n_critics: int = option(2, "critics; targets use the min over them (1 for DDPG)", ge=1)
    policy_delay: int = option(2, "actor and target updates every this many critic updates", ge=1)
    target_noise: float = option(0.2, "std of the smoothing noise on target actions (unit action scale)", ge=0)
    target_noise_clip: float = option(0.5, "clip of the smoothing noise", ge=0)
    exploration_noise: float = option(0.1, "std of the Gaussian exploration noise (unit action scale); with "
                                           "ornstein-uhlenbeck the process's sigma", ge=0)
    exploration_noise_type: Literal["normal", "ornstein-uhlenbeck"] = option(
        "normal", "exploration noise: normal (independent per step) or ornstein-uhlenbeck (SB3's OU process per "
                  "env, theta 0.15, dt 0.01, reset where an episode starts; rl-zoo's noise_type)")
    actor_lr: float | None = option(None, "actor learning rate (None: same as lr)", gt=0)
    learning_starts: int = option(10_000, "env steps collected before the first update", ge=0)


OU_THETA, OU_DT = 0.15, 1e-2  # SB3's OrnsteinUhlenbeckActionNoise defaults, which rl-zoo uses


def ornstein_uhlenbeck_step(x: torch.Tensor, sigma: float, normal: torch.Tensor, theta: float = OU_THETA,
                            dt: float = OU_DT) -> torch.Tensor:
    """One step of the Ornstein-Uhlenbeck process around 0 (SB3's, Euler-Maruyama):
    ``x + theta (0 - x) dt + sigma sqrt(dt) normal``, ``normal`` a unit-normal draw of ``x``'s shape."""
    return x + theta * (0.0 - x) * dt + sigma * math.sqrt(dt) * normal


class DelayedActor:
    """TD3's delayed policy updates, a part of the replay family (TD3, DDPG, MADDPG / MATD3):
    the actor and the target networks (``actor_target``, ``critics_target``) step every
    ``cfg.policy_delay`` critic steps; the critic-only steps report the last actor loss."""

    _last_actor_loss = None

    def _actor_step(self) -> bool:
        return (self.grad_steps + 1) % self.cfg.policy_delay == 0

    def graph_key(self):
        return self._actor_step(), self._last_actor_loss is None

    def after_step(self, stats):
        if "actor_loss" in stats:
            self.polyak(self.critics_target, self.critics, self.cfg.tau, self._pairs)
            self.polyak(self.actor_target, self.actor, self.cfg.tau, self._pairs)
            # kept in one tensor, written in place: a captured critic-only step reads it at replay
            if self._last_actor_loss is None:
                self._last_actor_loss = stats["actor_loss"].clone()
            else:
                self._last_actor_loss.copy_(stats["actor_loss"])
        elif self._last_actor_loss is not None:
            stats["actor_loss"] = self._last_actor_loss.clone()


class TD3(DelayedActor, ActorCriticOffPolicy):
    name = "td3"
    Config = TD3Config
    networks = ("actor", "critics", "actor_target", "critics_target")
    optimizers = ("actor_opt", "critic_opt")
    capturable = True

    def __init__(self, cfg: TD3Config, obs_space, act_space, num_envs, device, rng, role="learner"):
        if not isinstance(act_space, gym.spaces.Box):
            raise UserError(f"{self.name} needs a Box action space, got {act_space}; use dqn or ppo for Discrete")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.actor, self.critics = self._build(self.make_networks)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_opt = self._optimizer(self.actor.parameters(), cfg.actor_lr or cfg.lr)
        self.critic_opt = self._optimizer(self.critics.parameters(), cfg.lr)
        # the OU process's state per env column (None: Gaussian noise, nothing carried between steps)
        self.ou_noise = torch.zeros(num_envs, self.actor.box.dim, device=device) \
            if cfg.exploration_noise_type == "ornstein-uhlenbeck" else None

    def make_actor(self) -> torch.nn.Module:
        cfg = self.cfg
        return DeterministicActor(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.normalize_obs)

    def explore(self, obs):
        box = self.actor.box
        if self.env_steps < self.cfg.learning_starts:  # uniform warm-up, as in the paper
            unit = torch.rand(obs.shape[0], box.dim, generator=self.rng["noise"], device=self.device) * 2 - 1
            if self.ou_noise is not None:
                self.ou_step()  # the process runs through the warm-up, as SB3's does
        else:
            unit = self.actor(self.actor.enc(obs))
            if self.ou_noise is None:
                noise = self.cfg.exploration_noise * torch.randn(unit.shape, generator=self.rng["noise"],
                                                                 device=self.device)
            else:
                noise = self.ou_step()
            unit = (unit + noise).clamp(-1.0, 1.0)
        env_action = box.to_env(unit)
        return env_action, Action(env_action)

    def ou_step(self) -> torch.Tensor:
        """Advance each env's Ornstein-Uhlenbeck noise one step; returns it ``[N, A]``."""
        normal = torch.randn(self.ou_noise.shape, generator=self.rng["noise"], device=self.device)
        self.ou_noise = ornstein_uhlenbeck_step(self.ou_noise, self.cfg.exploration_noise, normal)
        return self.ou_noise

    def episodes_ended(self, ended: torch.Tensor) -> None:
        """The OU noise restarts from 0 in the columns whose episode ended (SB3 resets it at a done)."""
        if self.ou_noise is not None:
            self.ou_noise = self.ou_noise.masked_fill(ended.to(self.device, torch.bool).reshape(-1, 1), 0.0)

    def column_state(self) -> dict[str, torch.Tensor]:
        """The OU noise follows each env column's episodes (a collector keeps it in its resume state)."""
        return {"ou_noise": self.ou_noise.clone()} if self.ou_noise is not None else {}

    def extra_state(self):
        state = super().extra_state()
        if self.ou_noise is not None:
            state["ou_noise"] = self.ou_noise.clone()
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        if self.ou_noise is not None and "ou_noise" in state:
            self.ou_noise = state["ou_noise"].to(self.device).clone()

    def draw_noise(self, batch_size):
        if self.cfg.target_noise <= 0:
            return {}
        shape = (batch_size, self.actor.box.dim)
        return {"target": torch.randn(shape, generator=self.rng["noise"], device=self.device)}

    def phases(self, batch, noise, shared=None):
        cfg = self.cfg
        enc, view = self.actor.enc, self.critics.view
        obs = enc(batch.obs)
        action = self.actor.box.to_unit(batch.action)
        with torch.no_grad():
            # the target actor's own CNN for images; a normalizer is always the live one
            next_obs = self.actor_target.enc(batch.next_obs, norm=enc.norm) if enc.trainable else enc(batch.next_obs)
            next_action = self.actor_target(next_obs)
            if cfg.target_noise > 0:
                smoothing = (noise["target"] * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
                next_action = (next_action + smoothing).clamp(-1.0, 1.0)
            next_q = self.critics_target(view(batch.next_obs, next_obs), next_action).min(0).values
            target = batch.reward + batch.discount * next_q
        q = self.critics(view(batch.obs, obs), action)  # [n_critics, B]
        td = q - target
        sq = td.square() * batch.weights if cfg.prioritized else td.square()  # uniform weights are all 1
        critic_loss = sq.mean(1).sum()
        yield self.critic_opt, critic_loss
        stats = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean()}

        if self._actor_step():
            # Only the actor's parameters step; the critics just pass gradients to the action.
            self.critics.requires_grad_(False)
            actor_loss = -self.critics(view(batch.obs, obs), self.actor(obs))[0].mean()
            try:
                yield self.actor_opt, actor_loss
            finally:
                self.critics.requires_grad_(True)
            stats["actor_loss"] = actor_loss.detach()
        return stats, (td.detach().abs().max(0).values if cfg.prioritized else None)

DDPG_OVERRIDES = {"n_critics": 1, "policy_delay": 1, "target_noise": 0.0}
