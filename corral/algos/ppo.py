"""Proximal Policy Optimization (Schulman et al. 2017), discrete and continuous.

Clipped surrogate, optional value clipping, GAE (``corral.returns.gae``),
per-minibatch advantage normalization, entropy bonus, gradient clipping,
epochs x minibatches, linear schedules for learning rate and clip range, and an
optional target-KL early stop. Loss names follow the paper and CleanRL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from corral.actors.actor_critic import ActorCritic
from corral.actors.normalizer import RunningNormalizer
from corral.nets import CategoricalHead
from corral.algos.base import Algorithm
from corral.optim import FlatAdam
from corral.config import Activation, Schedule, option
from corral.errors import TrainingError, UserError
from corral.returns import gae, rollout_next_values
from corral.storage.rollout import RolloutStorage


@dataclass
class PPOConfig:
    n_steps: int = option(128, "env steps per env per rollout", ge=1)
    batch_size: int = option(64, "minibatch size (rollout size n_steps*num_envs is split into these)", ge=1)
    n_epochs: int = option(10, "passes over each rollout", ge=1)
    lr: float = option(3e-4, "Adam learning rate", gt=0)
    lr_schedule: Schedule = option("constant", "constant, or linear (anneal to 0 over the run)")
    gamma: float = option(0.99, "discount factor", ge=0, le=1)
    gae_lambda: float = option(0.95, "GAE lambda", ge=0, le=1)
    clip_range: float = option(0.2, "surrogate clip range epsilon", gt=0)
    clip_schedule: Schedule = option("constant", "constant, or linear (anneal to 0 over the run)")
    clip_range_vf: float | None = option(None, "value clipping range (None: no value clipping)", gt=0)
    normalize_advantage: bool = option(True, "normalize advantages per minibatch")
    ent_coef: float = option(0.0, "entropy bonus coefficient", ge=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = option(0.5, "global gradient norm clip", gt=0)
    target_kl: float | None = option(None, "stop the epochs early when approx KL exceeds 1.5x this", gt=0)
    adam_eps: float = option(1e-5, "Adam epsilon", gt=0)
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the policy and value MLPs", ge=1)
    activation: Activation = option("tanh", "hidden activation: tanh, relu, elu, silu")
    log_std_init: float = option(0.0, "initial log std of the Gaussian policy (Box actions)")
    normalize_obs: bool = option(False, "running observation normalization (saved with the actor)")
    normalize_reward: bool = option(False, "scale rewards by the running std of the discounted return")
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)


STAT_NAMES = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")


def ppo_loss(actor, obs, actions, old_log_probs, old_values, adv, ret, clip: float, cfg: PPOConfig,
             normalize_adv: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's minibatch loss in the paper's names (the one copy: PPO.update, the on-device loop
    and gradient workers call it). Returns ``(loss, stats)``, stats a tensor in ``STAT_NAMES``
    order, so callers decide when to read it (a host sync)."""
    if normalize_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    if isinstance(actor.head, CategoricalHead) and cfg.clip_range_vf is None:
        logits, value = actor.outputs(obs)
        return _CategoricalPPOLoss.apply(logits, value, actions, old_log_probs, adv, ret, clip,
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


def ppo_schedules(cfg: PPOConfig, optimizer, progress: float) -> tuple[float, float]:
    """Learning rate (set on ``optimizer``) and clip range at ``progress`` in [0, 1]."""
    frac = 1.0 - progress
    lr = cfg.lr * (frac if cfg.lr_schedule == "linear" else 1.0)
    clip = cfg.clip_range * (frac if cfg.clip_schedule == "linear" else 1.0)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr, clip


def ppo_batch(cfg: PPOConfig, data, last_value: torch.Tensor):
    """GAE over a full rollout ``data`` (``RolloutStorage.data``). Returns the flat batch,
    advantages, returns, and whether one minibatch holds the whole rollout; in that case
    the advantages are normalized here, once for all epochs (no shuffling needed either)."""
    with torch.no_grad():
        next_values = rollout_next_values(data.values, last_value, data.truncated, data.final_values)
        advantages, returns = gae(data.rewards, data.values, next_values, data.terminated,
                                  data.truncated, cfg.gamma, cfg.gae_lambda)
    adv, ret = advantages.flatten(), returns.flatten()
    full_batch = cfg.batch_size >= adv.shape[0]
    if full_batch and cfg.normalize_advantage:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    return data.flatten(), adv, ret, full_batch


class _CategoricalPPOLoss(torch.autograd.Function):
    """``ppo_loss`` for one Categorical head without value clipping, with its gradient
    written out (one autograd node instead of about fifteen; on small nets the autograd
    bookkeeping costs as much as the arithmetic). With logp = log_softmax(logits),
    p = exp(logp), r = exp(logp[a] - old), H = -sum(p logp), over a batch of B:

        d loss / d logp[a] = -A r / B   where the unclipped term is the one used
                                        (r within 1 +- clip, or -A r > -A clip(r)), else 0
        d loss / d logits  = d_logp[a] (onehot(a) - p) + ent_coef / B * p (logp + H)
        d loss / d value   = 2 vf_coef (value - ret) / B

    ``tests/test_ppo.py`` checks loss, statistics and gradients against the autograd path."""

    @staticmethod
    def forward(ctx, logits, value, actions, old_log_probs, adv, ret, clip, ent_coef, vf_coef):
        logp = torch.log_softmax(logits, dim=-1)
        p = logp.exp()
        entropy = -(p * logp).sum(-1)
        idx = actions.long().unsqueeze(-1)
        logratio = logp.gather(-1, idx).squeeze(-1) - old_log_probs
        ratio = logratio.exp()
        clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
        pg_loss = torch.max(-adv * ratio, -adv * clipped).mean()
        v_err = value - ret
        v_loss = v_err.square().mean()
        ent = entropy.mean()
        loss = pg_loss - ent_coef * ent + vf_coef * v_loss
        n = logits.shape[0]
        # the surrogate's gradient flows where the unclipped term is the one used
        live = (ratio == clipped) | (-adv * ratio > -adv * clipped)
        d_logp_a = torch.where(live, -adv * ratio, 0.0).div_(n)
        ctx.save_for_backward(logp, p, entropy, idx, d_logp_a, v_err)
        ctx.ent_scale, ctx.v_scale = ent_coef / n, 2.0 * vf_coef / n
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
        stats = torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac])
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        logp, p, entropy, idx, d_logp_a, v_err = ctx.saved_tensors
        d_logits = p * (logp + entropy.unsqueeze(-1)) * ctx.ent_scale
        d_logits.addcmul_(p, d_logp_a.unsqueeze(-1), value=-1.0)
        d_logits.scatter_add_(-1, idx, d_logp_a.unsqueeze(-1))
        d_value = v_err * ctx.v_scale
        if grad_loss is not None:
            d_logits.mul_(grad_loss)
            d_value = d_value * grad_loss
        return d_logits, d_value, None, None, None, None, None, None, None


class PPO(Algorithm):
    name = "ppo"
    Config = PPOConfig

    def __init__(self, cfg: PPOConfig, obs_space, act_space, num_envs, device, rng):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng)
        rollout = cfg.n_steps * num_envs
        if cfg.batch_size > rollout:
            raise UserError(
                f"ppo.batch_size={cfg.batch_size} is larger than the rollout n_steps*num_envs={rollout}; "
                "lower batch_size or raise n_steps"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"])
            self.actor = ActorCritic(obs_space, act_space, tuple(cfg.hidden), cfg.activation,
                                     cfg.normalize_obs, cfg.log_std_init).to(device)
        self.ret_norm = RunningNormalizer((), enabled=cfg.normalize_reward).to(device)
        self._disc_return = torch.zeros(num_envs, device=device)
        self.optimizer = FlatAdam(self.actor.parameters(), lr=cfg.lr, eps=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm)
        obs_shape, obs_dtype = self.actor.stored_obs()
        act_shape, act_dtype = self.actor.stored_action()
        self.storage = RolloutStorage(cfg.n_steps, num_envs, obs_shape, act_shape, act_dtype, device, obs_dtype)
        self._last_obs: torch.Tensor | None = None
        self.updates = 0

    # --- acting and storing
    def explore(self, obs):
        env_action, action, log_prob, value, x = self.actor.explore(obs, self.rng["action"])
        return env_action, {"action": action, "log_prob": log_prob, "value": value, "x": x}

    def observe(self, obs, extras, reward, terminated, truncated, final_obs, next_obs):
        final_values = torch.zeros_like(reward)
        if truncated.any():
            final_values = torch.where(truncated, self.actor.value(self.actor.normalize(final_obs)), final_values)
        if self.cfg.normalize_reward:
            reward = self._scale_reward(reward, terminated | truncated)
        self.storage.add(obs=extras["x"], actions=extras["action"], log_probs=extras["log_prob"],
                         values=extras["value"], rewards=reward, terminated=terminated,
                         truncated=truncated, final_values=final_values)
        self._last_obs = next_obs

    def _scale_reward(self, reward, done):
        self._disc_return.mul_(self.cfg.gamma).add_(reward)
        if self.actor.training:
            self.ret_norm.update(self._disc_return)
        self._disc_return.masked_fill_(done, 0.0)
        std = (self.ret_norm.var + self.ret_norm.eps).sqrt().float()
        return (reward / std).clamp(-self.cfg.reward_clip, self.cfg.reward_clip)

    def ready(self) -> bool:
        return self.storage.full

    @property
    def at_boundary(self) -> bool:
        return self.storage.step == 0

    # --- learning
    def update(self, progress: float) -> dict[str, float]:
        cfg = self.cfg
        lr, clip = ppo_schedules(cfg, self.optimizer, progress)
        with torch.no_grad():
            last_value = self.actor.value(self.actor.normalize(self._last_obs))
        b, adv_all, ret_all, full_batch = ppo_batch(cfg, self.storage.data, last_value)
        n = adv_all.shape[0]

        sums = torch.zeros(5, device=self.device)  # pg, v, entropy, approx_kl, clipfrac
        count = 0
        stop = False
        for _ in range(cfg.n_epochs):
            if full_batch:
                batches = [None]
            else:
                perm = torch.randperm(n, generator=self.rng["minibatch"], device=self.device)
                batches = [perm[i:i + cfg.batch_size] for i in range(0, n - cfg.batch_size + 1, cfg.batch_size)]
            for idx in batches:
                take = (lambda t: t) if idx is None else (lambda t: t[idx])  # noqa: E731
                loss, stats = ppo_loss(self.actor, take(b.obs), take(b.actions), take(b.log_probs), take(b.values),
                                       take(adv_all), take(ret_all), clip, cfg,
                                       normalize_adv=cfg.normalize_advantage and not full_batch)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()  # clips the global gradient norm, then Adam
                sums += stats
                count += 1
                if cfg.target_kl is not None and stats[3].item() > 1.5 * cfg.target_kl:
                    stop = True
                    break
            if stop:
                break

        self.storage.clear()
        self.updates += 1
        pg, v, ent, kl, cf = (sums / max(count, 1)).tolist()
        if not all(math.isfinite(x) for x in (pg, v, ent)):
            raise TrainingError(
                f"PPO loss became non-finite at update {self.updates} (pg_loss={pg}, v_loss={v}); "
                "lower ppo.lr, enable ppo.normalize_obs / normalize_reward, or check the env's rewards"
            )
        with torch.no_grad():
            var_ret = ret_all.var()
            explained_var = (1.0 - (ret_all - b.values).var() / var_ret).item() if var_ret > 0 else float("nan")
        return {
            "pg_loss": pg, "v_loss": v, "entropy": ent, "approx_kl": kl, "clipfrac": cf,
            "explained_variance": explained_var, "lr": lr, "clip_range": clip,
            "minibatches": float(count),
        }

    # --- state
    def state_dict(self):
        return {
            "actor": self.actor.state_dict(),
            "ret_norm": self.ret_norm.state_dict(),
            "disc_return": self._disc_return.clone(),
            "optimizer": self.optimizer.state_dict(),
            "storage": self.storage.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state):
        self.actor.load_state_dict(state["actor"])
        self.ret_norm.load_state_dict(state["ret_norm"])
        self._disc_return.copy_(state["disc_return"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.storage.load_state_dict(state["storage"])
        self.updates = int(state["updates"])
