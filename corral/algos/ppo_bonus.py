"""PPO with an exploration bonus: the part of PPO-RND (``corral.algos.ppo_rnd``) and PPO-ICM
(``corral.algos.ppo_icm``) that does not depend on which bonus it is.

What the bonus-agnostic loop does, on PPO's (``corral.algos.ppo``):

* **Two value heads.** ``TwoValueActorCritic``: policy, extrinsic value and intrinsic value,
  separate MLPs of ``hidden`` evaluated as one batched module (an image encoder is shared).
* **Warm-up.** The first ``warmup_steps`` env steps act uniformly at random (Discrete and
  MultiDiscrete actions) and only feed the bonus's observation normaliser (``bonus_warmup``).
* **Two returns.** The bonus's raw reward of each step (``bonus_reward``) is divided by a running
  std of intrinsic returns filtered along time per env (``IntrinsicReturnNormalizer``, column
  state). Extrinsic GAE with ``gamma``, episodic; intrinsic GAE with ``int_gamma``,
  non-episodic unless ``int_episodic``; each bootstraps with its own head's V(final_obs) where
  the env truncated. The policy's advantage is ``ext_coef * A_ext + int_coef * A_int``.
* **One minibatch loss.** PPO's loss with the extrinsic value, ``vf_coef`` times the intrinsic
  value's regression, plus the bonus's own loss (``bonus_loss``) on its own optimizer: every
  declared optimizer steps on the summed loss, and no parameter is shared between them.

A bonus declares its module, optimizer and per-step rollout buffers in its ``__init__`` and
supplies the hooks ``bonus_warmup``, ``bonus_reward``, ``bonus_batch``, ``bonus_loss`` and
``bonus_buffers`` (``rollout_key`` names its mid-rollout state in a checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import gymnasium as gym
import torch
import torch.nn.functional as F

from corral.actors.actor_critic import ActorCritic
from corral.algos.base import Step
from corral.algos.onpolicy import PPOBatch, make_extractor, normalized
from corral.algos.ppo import PPO, PPOConfig, ppo_loss
from corral.algos.recurrent_ppo import _Outputs
from corral.config import option
from corral.errors import UserError
from corral.exploration.rnd import IntrinsicReturnNormalizer
from corral.nets import CategoricalHead, MultiCategoricalHead, ParallelMLP
from corral.returns import gae, rollout_next_values


@dataclass
class BonusPPOConfig(PPOConfig):
    gamma: float = option(0.999, "extrinsic discount factor (episodic)", ge=0, le=1)
    int_gamma: float = option(0.99, "intrinsic discount factor (also the intrinsic-return filter's)", ge=0, le=1)
    int_episodic: bool = option(False, "cut intrinsic returns where an episode terminates (the paper: no cut)")
    ext_coef: float = option(2.0, "weight of the extrinsic advantage in the policy's advantage", ge=0)
    int_coef: float = option(1.0, "weight of the intrinsic advantage in the policy's advantage", ge=0)
    warmup_steps: int = option(1024, "env steps of random actions that only feed the bonus's observation "
                                     "normaliser before learning (counted in the run's steps)", ge=0)


class BonusExtras(NamedTuple):
    """What ``explore`` hands to ``observe`` (and collectors ship) per step."""

    action: torch.Tensor
    log_prob: torch.Tensor  # under the behaviour policy (uniform during warm-up)
    value: torch.Tensor  # extrinsic V
    value_int: torch.Tensor  # intrinsic V
    x: torch.Tensor
    warmup: torch.Tensor  # [N] bool: a warm-up step (random action; feeds the bonus's normaliser only)


class TwoValueActorCritic(ActorCritic):
    """``ActorCritic`` with a third body member, the intrinsic value. ``outputs``/``value``
    keep PPO's meaning (the extrinsic value); ``all_outputs`` gives both values."""

    def make_body(self, in_dim, hidden, activation, pi_out):
        return ParallelMLP(3, in_dim, hidden, activation, out_dim=pi_out, out_gains=(0.01, 1.0, 1.0), init=self.init)

    def all_outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Masked logits / mean, extrinsic value, intrinsic value."""
        out = self.body(self.features(x))
        logits = out[0]
        if self.mask_slice is not None:
            logits = logits.masked_fill(x[:, self.mask_slice] < 0.5, -1e8)
        return logits, out[1, :, 0], out[2, :, 0]

    def values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, v_ext, v_int = self.all_outputs(x)
        return v_ext, v_int

    def explore_two_values(self, obs: torch.Tensor, generator: torch.Generator | None, random: bool):
        """``(env_action, action, log_prob, value, value_int, x)``; ``random``: the action
        uniform over a Discrete / MultiDiscrete space and its log-prob under that uniform law."""
        x = self.normalize(obs, update=True)
        logits, value, value_int = self.all_outputs(x)
        params = self.head(logits)
        if random and isinstance(self.head, (CategoricalHead, MultiCategoricalHead)):
            params = self.head(torch.zeros_like(logits))
        action = self.head.sample(params, generator)
        return self.to_env(action), action, self.head.log_prob(params, action), value, value_int, x


@dataclass
class BonusBatch(PPOBatch):
    """PPO's flat batch plus the intrinsic stream and the bonus's own inputs (``bonus_batch``)."""

    values_int: torch.Tensor = None
    ret_int: torch.Tensor = None
    bonus: dict = field(default_factory=dict)


class BonusPPO(PPO):
    """PPO's loop with a second, intrinsic stream; the bonus is a subclass's hooks."""

    grad_sharding = None  # PPO's minibatch sharding does not cover this update
    user_actor = False  # builds its own actor (make_actor)
    Config = BonusPPOConfig
    rollout_key: ClassVar[str]  # the checkpoint key of the mid-rollout intrinsic buffers
    box_reason: ClassVar[str] = "the bonus reads them through a running mean/std"

    def __init__(self, cfg: BonusPPOConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        self.check_spaces(obs_space, act_space)
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.int_norm = IntrinsicReturnNormalizer(num_envs, cfg.int_gamma).to(device)
        if self.stores:
            T, N = cfg.n_steps, num_envs
            self.int_values = torch.zeros(T, N, device=device)
            self.novelty = torch.zeros(T, N, device=device)  # the bonus's raw rewards
            self.int_returns = torch.zeros(T, N, device=device)  # the filter's R_t, per env along time
        self.env_steps = 0  # this copy's view of the run's env steps (warm-up)
        self._batch_stats: dict[str, float] = {}

    def check_spaces(self, obs_space, act_space) -> None:
        if not isinstance(obs_space, gym.spaces.Box):
            raise UserError(f"{self.name} needs Box observations (vectors or images), got {obs_space}; "
                            f"{self.box_reason}")

    def make_actor(self):
        cfg = self.cfg
        return TwoValueActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                   cfg.normalize_obs, cfg.log_std_init,
                                   extractor=make_extractor(cfg.features, self.obs_space, self.name), init=cfg.init)

    # --- the bonus's hooks
    def bonus_warmup(self, step: Step) -> None:
        """What a warm-up step feeds the bonus (its observation normaliser)."""
        raise NotImplementedError

    def bonus_reward(self, step: Step, t: int) -> torch.Tensor:
        """The raw intrinsic reward ``[N]`` of ``step``; stores the bonus's inputs at rollout row ``t``."""
        raise NotImplementedError

    def bonus_batch(self) -> dict[str, torch.Tensor]:
        """The bonus's rollout inputs, flat ``[T*N, ...]``, folded into its normaliser first."""
        raise NotImplementedError

    def bonus_loss(self, bonus: dict[str, torch.Tensor], actions: torch.Tensor):
        """``(loss, stats)`` of the bonus on one minibatch (``stats`` in ``STATS`` order after
        ``v_loss_int``)."""
        raise NotImplementedError

    def bonus_buffers(self) -> tuple[torch.Tensor, ...]:
        """The bonus's per-step rollout buffers ``[T, N, ...]`` (saved mid-rollout)."""
        raise NotImplementedError

    # --- hooks
    def set_env_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def column_state(self) -> dict:
        return {**super().column_state(), "int_filter": self.int_norm.ret.clone()}

    def load_column_state(self, state: dict) -> None:
        state = dict(state)
        self.int_norm.ret.copy_(state.pop("int_filter"))
        super().load_column_state(state)

    # --- acting and storing
    def explore(self, obs):
        warm = self.env_steps < self.cfg.warmup_steps
        env_action, action, log_prob, value, value_int, x = self.actor.explore_two_values(obs, self.rng["action"],
                                                                                          warm)
        return env_action, BonusExtras(action, log_prob, value, value_int, x,
                                       torch.full((obs.shape[0],), warm, device=obs.device))

    def observe(self, step: Step):
        n = step.reward.shape[0]
        # the learner's own count decides in-process; collectors' fragments carry the flag, read
        # (a host read) only while a fragment started in warm-up can still arrive
        warm = self.env_steps < self.cfg.warmup_steps
        if not warm and self.env_steps < self.cfg.warmup_steps + self.cfg.n_steps * n:
            warm = bool(step.extras.warmup.any())
        self.env_steps += n
        if warm:
            self.bonus_warmup(step)
            self._last_obs = step.next_obs
            return
        t = self.storage.step
        novelty = self.bonus_reward(step, t)
        self.novelty[t].copy_(novelty)
        self.int_returns[t].copy_(self.int_norm.step(novelty))
        self.int_values[t].copy_(step.extras.value_int)
        super().observe(step)

    # --- the update: PPO's loop with two returns and the bonus's loss
    def both_final_values(self, truncated, final_obs):
        out = torch.zeros(2, *truncated.shape, device=self.device)
        if truncated.any():
            with torch.no_grad():
                v_ext, v_int = self.actor.values(final_obs[truncated])
                out[0][truncated], out[1][truncated] = v_ext, v_int
        return out

    def two_stream_advantages(self):
        """GAE of the extrinsic and the intrinsic stream (the raw rewards normalized by the
        running std of intrinsic returns), mixed ``ext_coef * A_ext + int_coef * A_int``;
        returns ``(adv, ret_ext, ret_int, int_rewards, whole)``."""
        cfg = self.cfg
        data = self.storage.data
        final_ext, final_int = self.both_final_values(data.truncated, data.final_obs)
        data.final_values.copy_(final_ext)
        with torch.no_grad():
            last_ext, last_int = self.actor.values(self.actor.normalize(self._last_obs))
            self.int_norm.update(self.int_returns)
            int_rewards = self.int_norm.normalize(self.novelty)
            adv_ext, ret_ext = gae(data.rewards, data.values,
                                   rollout_next_values(data.values, last_ext, data.truncated, final_ext),
                                   data.terminated, data.truncated, cfg.gamma, cfg.gae_lambda)
            term_int = data.terminated if cfg.int_episodic else torch.zeros_like(data.terminated)
            adv_int, ret_int = gae(int_rewards, self.int_values,
                                   rollout_next_values(self.int_values, last_int, data.truncated, final_int),
                                   term_int, data.truncated, cfg.int_gamma, cfg.gae_lambda)
            adv = (cfg.ext_coef * adv_ext + cfg.int_coef * adv_int).flatten()
        whole = cfg.batch_size >= adv.shape[0]
        if whole and cfg.normalize_advantage:
            adv = normalized(adv)
        return adv, ret_ext, ret_int, int_rewards, whole

    def prepare_batch(self) -> BonusBatch:
        data = self.storage.data
        adv, ret_ext, ret_int, int_rewards, whole = self.two_stream_advantages()
        bonus = self.bonus_batch()
        self._batch_stats = {"novelty": self.novelty.mean().item(), "int_reward": int_rewards.mean().item(),
                             "int_return_std": self.int_norm.std.item(), "ret_int": ret_int.mean().item()}
        b = data.flatten()
        return BonusBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret_ext.flatten(), whole,
                          values_int=self.int_values.flatten(), ret_int=ret_int.flatten(), bonus=bonus)

    def minibatch_losses(self, batch: BonusBatch, idx, clip: float):
        """``(ppo_part, v_loss_int, bonus_loss, stats)`` of one minibatch: PPO's loss with the
        extrinsic value (``pg_loss - ent_coef H + vf_coef v_loss``), the intrinsic value's
        regression and the bonus's loss; ``minibatch_step`` adds them (``vf_coef`` weighs the
        intrinsic value loss too)."""
        cfg = self.cfg
        take = (lambda t: t) if idx is None else (lambda t: t[idx])  # noqa: E731
        logits, v_ext, v_int = self.actor.all_outputs(take(batch.obs))
        ppo_part, stats = ppo_loss(_Outputs(self.actor.head, logits, v_ext), None, take(batch.actions),
                                   take(batch.log_probs), take(batch.values), take(batch.adv), take(batch.ret),
                                   clip, cfg, cfg.normalize_advantage and not batch.whole)
        ret_int = take(batch.ret_int)
        if cfg.clip_range_vf is None:
            v_loss_int = F.mse_loss(v_int, ret_int)
        else:
            old = take(batch.values_int)
            clipped = old + (v_int - old).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
            v_loss_int = torch.max((v_int - ret_int).square(), (clipped - ret_int).square()).mean()
        bonus_loss, bonus_stats = self.bonus_loss({k: take(v) for k, v in batch.bonus.items()}, take(batch.actions))
        stats = torch.cat([stats, v_loss_int.detach().unsqueeze(0), bonus_stats])
        return ppo_part, v_loss_int, bonus_loss, stats

    def minibatch_step(self, batch: BonusBatch, idx, clip: float):
        ppo_part, v_loss_int, bonus_loss, stats = self.minibatch_losses(batch, idx, clip)
        return stats, self.applier(ppo_part + self.cfg.vf_coef * v_loss_int + bonus_loss)

    def applier(self, loss: torch.Tensor):
        """Every declared optimizer (the actor-critic's, the bonus's) steps on the summed loss;
        they share no parameter, so each moves only its own side."""
        optimizers = self.declared_optimizers()

        def apply():
            for opt in optimizers:
                opt.zero_grad()
            loss.backward()
            for opt in optimizers:
                opt.step()

        return apply

    def update(self, progress: float) -> dict[str, float]:
        return {**super().update(progress), **self._batch_stats}

    # --- state
    def _rollout_buffers(self) -> tuple[torch.Tensor, ...]:
        return (self.int_values, self.novelty, self.int_returns, *self.bonus_buffers())

    def extra_state(self):
        state = {**super().extra_state(), "env_steps": self.env_steps}
        if self.storage is not None and self.storage.step:
            s = self.storage.step
            state[self.rollout_key] = [b[:s].clone() for b in self._rollout_buffers()]
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.env_steps = int(state["env_steps"])
        if self.storage is not None and self.rollout_key in state:
            for buf, saved in zip(self._rollout_buffers(), state[self.rollout_key]):
                buf[: saved.shape[0]] = saved
