"""Proximal Policy Optimization (Schulman et al. 2017), discrete and continuous.

Clipped surrogate, optional value clipping, GAE (``corral.returns.gae``),
per-minibatch advantage normalization, entropy bonus, gradient clipping,
epochs x minibatches, linear schedules for learning rate and clip range, and an
optional target-KL early stop. Loss names follow the paper and CleanRL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F

from corral.actors.actor_critic import ActorCritic
from corral.actors.normalizer import RunningNormalizer
from corral.algos.base import Algorithm, Step
from corral.config import Activation, Schedule, option
from corral.errors import TrainingError, UserError
from corral.nets import MLP, CategoricalHead, NatureCNN
from corral.optim import FlatAdam
from corral.returns import gae, rollout_next_values
from corral.storage import storage_class
from corral.storage.rollout import RolloutStorage


def features_option():
    return option(None, "a feature extractor in place of the built-in encoder: 'module:callable' (or, from Python, "
                        "the class) called with the observation space, returning an nn.Module with an int out_dim; "
                        "or a built-in: " + ", ".join(BUILTIN_FEATURES))


def actor_option():
    return option(None, "a user's actor-critic in place of ActorCritic: 'module:callable' (or, from Python, the "
                        "class) called as (obs_space, act_space, algo_config), returning an nn.Module with "
                        "ActorCritic's interface (subclass corral.actors.ActorCritic to get it; docs/custom.md)")


def storage_option():
    return option(None, "the rollout storage: a name registered with corral.register_storage, or 'module:Class', "
                        "a subclass of corral.storage.RolloutStorage (None: RolloutStorage)")


def _mlp_features(obs_space) -> torch.nn.Module:
    mlp = MLP(int(math.prod(obs_space.shape)), (64,), "tanh")
    net = torch.nn.Sequential(torch.nn.Flatten(), mlp)
    net.out_dim = mlp.out_dim
    return net


# built-in feature extractors by name (``ppo.features=nature_cnn``): obs space -> module with out_dim
BUILTIN_FEATURES = {
    "mlp": _mlp_features,
    "nature_cnn": lambda space: NatureCNN(tuple(space.shape)),
}

# what PPO's loop calls on its actor (``ppo.actor`` must provide them; ActorCritic does)
ACTOR_METHODS = ("normalize", "stored_obs", "stored_action", "explore", "act", "evaluate_actions", "value",
                 "outputs", "to_env")


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
    features: str | None = features_option()
    actor: str | None = actor_option()
    storage: str | None = storage_option()
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)


STAT_NAMES = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")


def ppo_loss(actor, obs, actions, old_log_probs, old_values, adv, ret, clip: float, cfg: PPOConfig,
             normalize_adv: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's minibatch loss in the paper's names (the one copy: PPO.update, the on-device loop
    and gradient workers call it). Returns ``(loss, stats)``, stats a tensor in ``STAT_NAMES``
    order, so callers decide when to read it (a host sync)."""
    if normalize_adv:
        adv = normalized(adv)
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


def make_extractor(spec: str | None, obs_space, algo: str) -> torch.nn.Module | None:
    """The user's feature extractor ``spec`` names, built for ``obs_space`` (None: the built-in one)."""
    if spec is None:
        return None
    from corral.envs.make import _load_attr

    build = BUILTIN_FEATURES.get(spec) or _load_attr(spec, f"{algo}.features")
    module = build(obs_space)
    if not isinstance(module, torch.nn.Module) or not isinstance(getattr(module, "out_dim", None), int):
        raise UserError(f"{algo}.features={spec!r} must build an nn.Module with an int out_dim (its feature size); "
                        f"it built {type(module).__name__}")
    return module


def make_user_actor(cfg, obs_space, act_space, algo: str) -> torch.nn.Module:
    """``cfg.actor`` built as (obs_space, act_space, cfg), checked for the methods PPO's loop calls."""
    from corral.envs.make import _load_attr

    if cfg.features is not None:
        raise UserError(f"{algo}.actor and {algo}.features are both set: a user's actor builds its own encoder; "
                        "unset one of them")
    try:
        module = _load_attr(cfg.actor, f"{algo}.actor")(obs_space, act_space, cfg)
    except TypeError as e:
        raise UserError(f"{algo}.actor={cfg.actor!r} could not be called as (obs_space, act_space, config): {e}") \
            from None
    missing = [m for m in ACTOR_METHODS if not callable(getattr(module, m, None))]
    if not isinstance(module, torch.nn.Module) or missing:
        raise UserError(f"{algo}.actor={cfg.actor!r} must build an nn.Module with ActorCritic's interface "
                        f"(missing: {', '.join(missing) or 'nn.Module'}); subclass corral.actors.ActorCritic")
    return module


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
    full_batch = cfg.batch_size <= 0 or cfg.batch_size >= adv.shape[0]  # 0: the whole rollout (A2C)
    if full_batch and cfg.normalize_advantage:
        adv = normalized(adv)
    return data.flatten(), adv, ret, full_batch


def normalized(adv: torch.Tensor) -> torch.Tensor:
    """Advantages scaled to mean 0 and std 1; a minibatch of one becomes 0 (its std is undefined)."""
    return (adv - adv.mean()) / (adv.std(correction=1 if adv.numel() > 1 else 0) + 1e-8)


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


class PPOExtras(NamedTuple):
    """What PPO's ``explore`` hands to ``observe`` for each step."""

    action: torch.Tensor  # policy-space action as sampled
    log_prob: torch.Tensor  # under the behaviour policy
    value: torch.Tensor
    x: torch.Tensor  # the normalized observation the policy saw (what the rollout stores)


@dataclass
class PPOBatch:
    """One update's rollout, flat ``[T*N]``, with GAE advantages and returns."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    adv: torch.Tensor
    ret: torch.Tensor
    whole: bool  # one minibatch holds all of it (advantages normalized once, no shuffling)

    @property
    def size(self) -> int:
        return int(self.adv.shape[0])


class PPO(Algorithm):
    """PPO, and the update loop its family shares (IMPALA/APPO, sharded PPO, device-resident runs).

    ``update`` is: schedules, ``prepare_batch`` (GAE here, V-trace columns in IMPALA),
    ``train_minibatches`` over ``minibatch_plan`` (each minibatch a ``minibatch_step``:
    statistics first, then the optimizer step, so a target-KL stop happens before the
    step that overshoots), and one epilogue (``finish``: finite check, explained variance,
    metrics). A family member overrides the pieces it changes, never the loop."""

    name = "ppo"
    Config = PPOConfig
    grad_sharding = "minibatches"  # A2C and REINFORCE too (their own loss in minibatch_loss)
    # make_actor takes a user's actor class (``actor``); a subclass that builds its own declares False
    user_actor: ClassVar[bool] = True
    networks = ("actor", "ret_norm")
    optimizers = ("optimizer",)
    STATS = STAT_NAMES
    KL = STAT_NAMES.index("approx_kl")

    def __init__(self, cfg: PPOConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        rollout = cfg.n_steps * num_envs
        if self.stores and cfg.batch_size > rollout:
            raise UserError(
                f"{self.name}.batch_size={cfg.batch_size} is larger than the rollout n_steps*num_envs={rollout}; "
                "lower batch_size or raise n_steps"
            )
        if cfg.actor is not None and not self.user_actor:
            raise UserError(f"{self.name}.actor: a user's actor class is taken where the algorithm builds PPO's "
                            f"actor-critic; {self.name} builds its own: subclass {type(self).__name__} and override "
                            "make_actor instead (docs/custom.md)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"])
            self.actor = self.make_actor().to(device)
        self.ret_norm = RunningNormalizer((), enabled=cfg.normalize_reward).to(device)
        self._disc_return = torch.zeros(num_envs, device=device)
        self.optimizer = self.make_optimizer() if self.learns else None
        self.storage = None
        if self.stores:
            obs_shape, obs_dtype = self.actor.stored_obs()
            act_shape, act_dtype = self.actor.stored_action()
            storage_cls = storage_class(cfg.storage, RolloutStorage, f"{self.name}.storage")
            self.storage = storage_cls(cfg.n_steps, num_envs, obs_shape, act_shape, act_dtype, device, obs_dtype)
        self._last_obs: torch.Tensor | None = None
        self.updates = 0

    def ensemble_vote(self) -> str | None:
        if isinstance(self.actor, ActorCritic) and isinstance(self.actor.head, CategoricalHead):
            return "probs"
        return super().ensemble_vote()

    def make_actor(self) -> torch.nn.Module:
        """The actor-critic (built under the run's init seed): the user's ``actor`` class, else
        ``ActorCritic``. A subclass or a problem (the MaxCut node policy) returns its own module
        with ``ActorCritic``'s interface."""
        cfg = self.cfg
        if cfg.actor is not None:
            return make_user_actor(cfg, self.obs_space, self.act_space, self.name)
        return ActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.normalize_obs,
                           cfg.log_std_init, extractor=make_extractor(cfg.features, self.obs_space, self.name))

    def make_optimizer(self):
        """The one optimizer over the actor-critic (A2C picks RMSprop here). A flat optimizer
        (``corral.optim``): gradient workers send gradients in its layout."""
        cfg = self.cfg
        return FlatAdam(self.actor.parameters(), lr=cfg.lr, eps=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm)

    # --- hooks
    def fragment_length(self) -> int:
        return self.cfg.n_steps

    def scheme_config(self, collectors: int) -> dict:
        # K collectors' fragments make one update's batch, K times the in-process one
        return {"n_steps": self.cfg.n_steps * collectors} if collectors > 1 else {}

    def column_state(self) -> dict:
        return {"_disc_return": self._disc_return.clone()} if self.cfg.normalize_reward else {}

    # --- acting and storing
    def explore(self, obs):
        env_action, action, log_prob, value, x = self.actor.explore(obs, self.rng["action"])
        return env_action, PPOExtras(action, log_prob, value, x)

    def observe(self, step: Step):
        # No host read here: V(final_obs) of truncated steps is computed at update time, in one
        # batch (``final_values`` in ``prepare_batch``), from the normalized final observations stored densely.
        ex, reward = step.extras, step.reward
        if self.cfg.normalize_reward:
            reward = self._scale_reward(reward, step.episode_ended())
        self.storage.add(obs=ex.x, actions=ex.action, log_probs=ex.log_prob, values=ex.value, rewards=reward,
                         terminated=step.terminated, truncated=step.truncated,
                         final_obs=self.actor.normalize(step.final_obs))
        self._last_obs = step.next_obs

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
        return self.storage is None or self.storage.step == 0

    # --- the family's update loop
    def update(self, progress: float) -> dict[str, float]:
        lr, clip = ppo_schedules(self.cfg, self.optimizer, progress)
        batch = self.prepare_batch()
        sums, evaluated, steps, extra = self.train_minibatches(batch, clip)
        self.storage.clear()
        self.updates += 1
        return {**self.finish(batch, sums, evaluated, steps), "lr": lr, "clip_range": clip, **extra}

    def bootstrap_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V of raw observations with the current network (no gradient)."""
        with torch.no_grad():
            return self.actor.value(self.actor.normalize(obs))

    def final_values(self, truncated: torch.Tensor, final_obs: torch.Tensor) -> torch.Tensor:
        """V(final_obs) where ``truncated`` (0 elsewhere), with the current network, one forward
        over the truncated steps only."""
        out = torch.zeros(truncated.shape, device=self.device)
        if truncated.any():  # one host read per update, not per step
            with torch.no_grad():
                out[truncated] = self.actor.value(final_obs[truncated])
        return out

    def prepare_batch(self) -> PPOBatch:
        data = self.storage.data
        data.final_values.copy_(self.final_values(data.truncated, data.final_obs))
        b, adv, ret, whole = ppo_batch(self.cfg, data, self.bootstrap_value(self._last_obs))
        return PPOBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret, whole)

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

    def minibatch_step(self, batch: PPOBatch, idx, clip: float):
        """``(stats, apply)``: the minibatch's statistics (a tensor in ``STATS`` order) and a
        callable that takes the optimizer step with its gradient."""
        take = (lambda t: t) if idx is None else (lambda t: t[idx])  # noqa: E731
        loss, stats = self.minibatch_loss(take(batch.obs), take(batch.actions), take(batch.log_probs),
                                          take(batch.values), take(batch.adv), take(batch.ret), clip,
                                          self.cfg.normalize_advantage and not batch.whole)
        return stats, self.applier(loss)

    def applier(self, loss: torch.Tensor):
        """The callable that takes the optimizer step with ``loss``'s gradient."""
        def apply():
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()  # clips the global gradient norm, then Adam

        return apply

    def train_minibatches(self, batch, clip: float):
        """Run the plan; returns (summed stats, minibatches evaluated, optimizer steps, extra metrics)."""
        target_kl = self.cfg.target_kl
        sums = torch.zeros(len(self.STATS), device=self.device)
        evaluated = steps = 0
        for idx in self.minibatch_plan(batch):
            stats, apply = self.minibatch_step(batch, idx, clip)
            sums += stats
            evaluated += 1
            if target_kl is not None and stats[self.KL].item() > 1.5 * target_kl:
                break  # this minibatch's step would move the policy too far: stop before it
            apply()
            steps += 1
        return sums, evaluated, steps, {}

    def explained_variance(self, batch: PPOBatch) -> float:
        with torch.no_grad():
            var_ret = batch.ret.var()
            return (1.0 - (batch.ret - batch.values).var() / var_ret).item() if var_ret > 0 else float("nan")

    def finish(self, batch, sums: torch.Tensor, evaluated: int, steps: int) -> dict[str, float]:
        """The epilogue every family member shares: mean stats, finite check, explained variance."""
        stats = dict(zip(self.STATS, (sums / max(evaluated, 1)).tolist()))
        bad = [k for k in ("pg_loss", "v_loss", "entropy") if not math.isfinite(stats[k])]
        if bad:
            raise TrainingError(
                f"{self.name}: {bad[0]} became non-finite at update {self.updates} "
                f"(pg_loss={stats['pg_loss']}, v_loss={stats['v_loss']}); lower {self.name}.lr, enable "
                f"{self.name}.normalize_obs / normalize_reward, or check the env's rewards"
            )
        return {**stats, "explained_variance": self.explained_variance(batch), "minibatches": float(steps)}

    # --- state
    def extra_state(self):
        state = {"disc_return": self._disc_return.clone(), "updates": self.updates}
        if self.storage is not None:
            state["storage"] = self.storage.state_dict()
        return state

    def load_extra_state(self, state):
        self._disc_return.copy_(state["disc_return"])
        if self.storage is not None:
            self.storage.load_state_dict(state["storage"])
        self.updates = int(state["updates"])
