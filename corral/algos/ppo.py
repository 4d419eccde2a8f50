"""Proximal Policy Optimization (Schulman et al. 2017), discrete and continuous.

Clipped surrogate, optional value clipping, GAE (``corral.returns.gae``),
per-minibatch advantage normalization, entropy bonus, gradient clipping,
epochs x minibatches, linear schedules for learning rate and clip range, and an
optional target-KL early stop. Loss names follow the paper and CleanRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from corral.algos.onpolicy import (
    OnPolicy,
    OnPolicyConfig,
    PPOBatch,
    actor_option,
    check_batch_size,
    make_user_actor,
    normalized,
    scheduled,
)
from corral.algos.sde import SDEConfig
from corral.config import Schedule, option
from corral.errors import UserError
from corral.kernels.ppo import CategoricalPPOLoss
from corral.nets import CategoricalHead
from corral.optim import FlatAdam


@dataclass
class SurrogateConfig(OnPolicyConfig):
    """The options of PPO's update that IMPALA/APPO shares (``SurrogateParts``): minibatches and
    epochs, the clip range (APPO's surrogate) and its schedule, the loss weights, Adam and its
    gradient clip, the target-KL stop, reward scaling and a user's actor. ``PPOConfig`` adds
    GAE's lambda and value clipping, which IMPALA has no use for."""

    batch_size: int = option(64, "minibatch size (rollout size n_steps*num_envs is split into these)", ge=1)
    n_epochs: int = option(10, "passes over each rollout", ge=1)
    clip_range: float = option(0.2, "surrogate clip range epsilon", gt=0)
    clip_schedule: Schedule = option("constant", "constant, or linear (anneal to 0 over the run)")
    ent_coef: float = option(0.0, "entropy bonus coefficient", ge=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = option(0.5, "global gradient norm clip", gt=0)
    target_kl: float | None = option(None, "stop the epochs early when approx KL exceeds 1.5x this", gt=0)
    adam_eps: float = option(1e-5, "Adam epsilon", gt=0)
    normalize_reward: bool = option(False, "scale rewards by the running std of the discounted return")
    actor: str | None = actor_option()
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)
    reward_clip_low: float | None = option(
        None, "with normalize_reward: clip scaled rewards below at -this, not -reward_clip, for the first "
              "reward_clip_low_until of the run (a rare large penalty, a fall, then weighs no more than this while "
              "the policy learns to move; the env's reward is unchanged)", gt=0)
    reward_clip_low_until: float = option(1.0, "the share of the run reward_clip_low holds for", ge=0, le=1)


@dataclass
class PPOConfig(SDEConfig, SurrogateConfig):
    gae_lambda: float = option(0.95, "GAE lambda", ge=0, le=1)
    clip_range_vf: float | None = option(None, "value clipping range (None: no value clipping)", gt=0)


STAT_NAMES = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")


def ppo_loss(actor, obs, actions, old_log_probs, old_values, adv, ret, clip: float, cfg: PPOConfig,
             normalize_adv: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's minibatch loss in the paper's names (the one copy: PPO.update, the on-device loop
    and gradient workers call it). Returns ``(loss, stats)``, stats a tensor in ``STAT_NAMES``
    order, so callers decide when to read it (a host sync)."""
    if normalize_adv:
        adv = normalized(adv)
    if isinstance(actor.head, CategoricalHead) and cfg.clip_range_vf is None:
        # the kernel (corral/kernels/ppo.py): the lines below with their gradient written out
        logits, value = actor.outputs(obs)
        return CategoricalPPOLoss.apply(logits, value, actions, old_log_probs, adv, ret, clip,
                                        cfg.ent_coef, cfg.vf_coef)
    log_prob, entropy, value = actor.evaluate_actions(obs, actions)
    logratio = log_prob - old_log_probs
    ratio = logratio.exp()
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
    if cfg.clip_range_vf is None:
        v_loss = F.mse_loss(value, ret)
    else:
        v_clipped = old_values + (value - old_values).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
        v_loss = torch.max((value - ret).square(), (v_clipped - ret).square()).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
        stats = torch.stack([pg_loss.detach(), v_loss.detach(), entropy_loss.detach(), approx_kl, clipfrac])
    return loss, stats


class SurrogateParts(OnPolicy):
    """The parts PPO and IMPALA/APPO share on the on-policy loop (``corral.algos.onpolicy``): a
    user's ``actor`` class, Adam with a clipped gradient norm, reward scaling, the clip range's
    schedule (the loss's parameter) and the target-KL stop. Each member adds its returns,
    batcher and loss (PPO: GAE, shuffled minibatches, ``ppo_loss``; IMPALA: V-trace, env
    columns, its own loss)."""

    # make_actor takes a user's actor class (``actor``); a subclass that builds its own declares False
    user_actor: ClassVar[bool] = True
    KL: ClassVar[int]  # where the loss's statistics hold the approximate KL (``stop_early``)

    def __init__(self, cfg: SurrogateConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if role == "learner":
            check_batch_size(self.name, cfg.batch_size, cfg.n_steps, num_envs)
        if cfg.actor is not None and not self.user_actor:
            raise UserError(f"{self.name}.actor: a user's actor class is taken where the algorithm builds PPO's "
                            f"actor-critic; {self.name} builds its own: subclass {type(self).__name__} and override "
                            "make_actor instead (docs/custom.md)")
        if cfg.reward_clip_low is not None and not cfg.normalize_reward:
            raise UserError(f"{self.name}.reward_clip_low clips scaled rewards: set {self.name}.normalize_reward=true "
                            "with it, or leave it unset")
        self._progress = 0.0  # the run's progress at the last update (reward_clip_low's share)
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)

    def make_actor(self) -> torch.nn.Module:
        """The user's ``actor`` class, else ``ActorCritic`` (``OnPolicy.make_actor``)."""
        if self.cfg.actor is not None:
            return make_user_actor(self.cfg, self.obs_space, self.act_space, self.name)
        return super().make_actor()

    def make_optimizer(self):
        cfg = self.cfg
        return FlatAdam(self.actor.parameters(), lr=cfg.lr, eps=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm)

    def reward_clip(self) -> float | None:
        return self.cfg.reward_clip if self.cfg.normalize_reward else None

    def reward_clip_below(self) -> float | None:
        cfg = self.cfg
        # the run's progress at the last update: the rollouts after the first update past the share
        # are clipped at -reward_clip
        if cfg.reward_clip_low is not None and self._progress < cfg.reward_clip_low_until:
            return cfg.reward_clip_low
        return self.reward_clip()

    def extra_state(self):
        state = super().extra_state()
        if self.cfg.reward_clip_low is not None:
            state["progress"] = self._progress
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self._progress = float(state.get("progress", 0.0))

    def schedules(self, progress: float):
        """The learning rate and the clip range at ``progress``; the clip range goes to the loss."""
        self._progress = progress
        metrics, _ = super().schedules(progress)
        clip = scheduled(self.cfg.clip_range, self.cfg.clip_schedule, self.schedule_progress(progress))
        return {**metrics, "clip_range": clip}, clip

    def stop_early(self, stats: torch.Tensor) -> bool:
        target_kl = self.cfg.target_kl
        return target_kl is not None and stats[self.KL].item() > 1.5 * target_kl


class PPO(SurrogateParts):
    """PPO on the on-policy loop, with its parts: GAE, the clipped surrogate (``ppo_loss``),
    epochs x shuffled minibatches, and the parts it shares with IMPALA (``SurrogateParts``).
    ppo_lstm, the bonus variants and MAPPO build on it."""

    name = "ppo"
    Config = PPOConfig
    grad_sharding = "minibatches"
    STATS = STAT_NAMES
    KL = STAT_NAMES.index("approx_kl")

    def whole_batch(self, rows: int) -> bool:
        return self.cfg.batch_size <= 0 or self.cfg.batch_size >= rows

    def minibatch_plan(self, batch: PPOBatch):
        """Per epoch, a fresh permutation cut into ``batch_size`` rows (the last minibatch
        may be smaller: every transition is used); ``None`` is the whole batch."""
        cfg = self.cfg
        for _ in range(cfg.n_epochs):
            if batch.whole:
                yield None
            else:
                yield from torch.randperm(batch.size, generator=self.rng["minibatch"],
                                          device=self.device).split(cfg.batch_size)

    def minibatch_loss(self, obs, actions, log_probs, values, adv, ret, clip: float, normalize_adv: bool):
        """``(loss, stats)`` of one minibatch (gradient workers call this too)."""
        return ppo_loss(self.actor, obs, actions, log_probs, values, adv, ret, clip, self.cfg, normalize_adv)
