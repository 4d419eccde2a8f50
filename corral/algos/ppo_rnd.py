"""PPO with Random Network Distillation (``ppo_rnd``; Burda et al. 2018, "Exploration by
Random Network Distillation").

A small diff over PPO's loop (``corral.algos.ppo``). The exploration bonus is RND's
(``corral.exploration.rnd``): the intrinsic reward of step t is the predictor's error on the
observation it led to, divided by a running std of *intrinsic returns* filtered along time
per env (``IntrinsicReturnNormalizer``). What changes against PPO:

* **Two value heads.** The actor-critic's body has a third member: policy, extrinsic value,
  intrinsic value, separate MLPs of ``hidden`` evaluated as one batched module (an image
  encoder, the Nature CNN, is shared by all three, as in the paper).
* **Two returns.** Extrinsic GAE with ``gamma`` (episodic: cut where an episode terminates);
  intrinsic GAE with ``int_gamma``, non-episodic by default (no cut at a termination: the
  intrinsic return runs on into the next episode, ``int_episodic`` restores the cut). Both
  bootstrap with their own head's V(final_obs) where the env truncated (or a collector's
  fragment ends). The policy's advantage is ``ext_coef * A_ext + int_coef * A_int``, then
  normalized as PPO's; each value head regresses on its own return (``vf_coef`` each).
* **The predictor** is trained in the same minibatches on a ``rnd_fraction`` of each (the
  mask from the run's ``rnd`` stream), with its own Adam (``rnd_lr``) and gradient clip; the
  target network never changes. Before the epochs, the rollout's observations are folded into
  RND's observation normaliser (as CleanRL does), then the predictor trains on them.
* **Warm-up.** The first ``warmup_steps`` env steps act uniformly at random (Discrete and
  MultiDiscrete actions; other action spaces act with the policy) and only feed RND's
  observation normaliser; they count in the run's steps and store nothing.

Where the intrinsic reward is computed: as the learner *observes* each step (the predictor
and RND's normaliser only change in ``update``, so this equals computing it over the finished
rollout, as the paper does), on the learner. Collectors ship plain fragments and need nothing
new; the learner replays them through ``observe``, and the intrinsic-return filter is per-env
column state (``column_state``), swapped per collector like PPO's reward-scaling return, so
it runs along each collector's own time. Gradient workers (``scheme.grad_workers > 1``) are
not wired (``corral.schemes.grad`` refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import torch
import torch.nn.functional as F

from corral.actors.actor_critic import ActorCritic
from corral.algos.base import Step
from corral.algos.ppo import PPO, STAT_NAMES, PPOBatch, PPOConfig, make_extractor, normalized, ppo_loss
from corral.algos.recurrent_ppo import _Outputs
from corral.config import option
from corral.errors import UserError
from corral.exploration.rnd import RND, IntrinsicReturnNormalizer
from corral.nets import CategoricalHead, MultiCategoricalHead, ParallelMLP
from corral.optim import FlatAdam
from corral.returns import gae, rollout_next_values


@dataclass
class PPORNDConfig(PPOConfig):
    gamma: float = option(0.999, "extrinsic discount factor (episodic)", ge=0, le=1)
    int_gamma: float = option(0.99, "intrinsic discount factor (also the intrinsic-return filter's)", ge=0, le=1)
    int_episodic: bool = option(False, "cut intrinsic returns where an episode terminates (the paper: no cut)")
    ext_coef: float = option(2.0, "weight of the extrinsic advantage in the policy's advantage", ge=0)
    int_coef: float = option(1.0, "weight of the intrinsic advantage in the policy's advantage", ge=0)
    rnd_fraction: float = option(0.25, "fraction of each minibatch that trains the predictor (drawn per sample)",
                                 gt=0, le=1)
    rnd_lr: float | None = option(None, "the predictor's Adam learning rate (None: lr; not scheduled)", gt=0)
    rnd_hidden: tuple[int, ...] = option((64, 64), "hidden sizes of RND's target MLP on flat observations "
                                                   "(the predictor gets one more layer)", ge=1)
    rnd_features: int = option(64, "output size of RND's target and predictor (the paper: 512 on Atari)", ge=1)
    rnd_frames: int = option(1, "image observations: the newest this many stacked frames RND sees (0: all)", ge=0)
    rnd_obs_clip: float = option(5.0, "clip RND's normalized observations to +-this", gt=0)
    warmup_steps: int = option(1024, "env steps of random actions that only feed RND's observation normaliser "
                                     "before learning (counted in the run's steps)", ge=0)


class RNDExtras(NamedTuple):
    """What ``ppo_rnd``'s ``explore`` hands to ``observe`` (and collectors ship) per step."""

    action: torch.Tensor
    log_prob: torch.Tensor  # under the behaviour policy (uniform during warm-up)
    value: torch.Tensor  # extrinsic V
    value_int: torch.Tensor  # intrinsic V
    x: torch.Tensor
    warmup: torch.Tensor  # [N] bool: a warm-up step (random action; feeds RND's normaliser only)


class RNDActorCritic(ActorCritic):
    """``ActorCritic`` with a third body member, the intrinsic value. ``outputs``/``value``
    keep PPO's meaning (the extrinsic value); ``all_outputs`` gives both values."""

    def make_body(self, in_dim, hidden, activation, pi_out):
        return ParallelMLP(3, in_dim, hidden, activation, out_dim=pi_out, out_gains=(0.01, 1.0, 1.0))

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

    def explore_rnd(self, obs: torch.Tensor, generator: torch.Generator | None, random: bool):
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
class RNDBatch(PPOBatch):
    """PPO's flat batch plus the intrinsic stream and RND's observations."""

    values_int: torch.Tensor = None
    ret_int: torch.Tensor = None
    rnd_obs: torch.Tensor = None  # [B, *RND.in_shape]: the observation each step led to, as RND sees it


class PPORND(PPO):
    name = "ppo_rnd"
    grad_sharding = None  # PPO's minibatch sharding does not cover this update
    user_actor = False  # builds its own actor (make_actor)
    Config = PPORNDConfig
    networks = ("actor", "ret_norm", "rnd", "int_norm")
    optimizers = ("optimizer", "rnd_optimizer")
    STATS = STAT_NAMES + ("v_loss_int", "rnd_loss")

    def __init__(self, cfg: PPORNDConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if not isinstance(obs_space, gym.spaces.Box):
            raise UserError(f"ppo_rnd needs Box observations (vectors or images), got {obs_space}; RND's networks "
                            "read them through a running mean/std")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"] + 1)  # not the actor's draws
            self.rnd = RND(obs_space, tuple(cfg.rnd_hidden), cfg.rnd_features, cfg.rnd_obs_clip, cfg.rnd_frames,
                           generator=rng["rnd"]).to(device)
        self.int_norm = IntrinsicReturnNormalizer(num_envs, cfg.int_gamma).to(device)
        self.rnd_optimizer = None
        if self.learns:
            self.rnd_optimizer = FlatAdam(self.rnd.predictor.parameters(), lr=cfg.rnd_lr or cfg.lr, eps=cfg.adam_eps,
                                          max_grad_norm=cfg.max_grad_norm)
        if self.stores:
            T, N = cfg.n_steps, num_envs
            self.int_values = torch.zeros(T, N, device=device)
            self.novelty = torch.zeros(T, N, device=device)  # raw prediction errors
            self.int_returns = torch.zeros(T, N, device=device)  # the filter's R_t, per env along time
            dtype = torch.uint8 if self.rnd.image else torch.float32
            self.rnd_obs = torch.zeros(T, N, *self.rnd.in_shape, dtype=dtype, device=device)
        self.env_steps = 0  # this copy's view of the run's env steps (warm-up)
        self._batch_stats: dict[str, float] = {}

    def make_actor(self):
        cfg = self.cfg
        return RNDActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.normalize_obs,
                              cfg.log_std_init, extractor=make_extractor(cfg.features, self.obs_space, self.name))

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
        env_action, action, log_prob, value, value_int, x = self.actor.explore_rnd(obs, self.rng["action"], warm)
        return env_action, RNDExtras(action, log_prob, value, value_int, x,
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
            self.rnd.update_obs_norm(step.final_obs)
            self._last_obs = step.next_obs
            return
        t = self.storage.step
        selected = self.rnd.select(step.final_obs)
        novelty = self.rnd.novelty(selected)
        self.novelty[t].copy_(novelty)
        self.int_returns[t].copy_(self.int_norm.step(novelty))
        self.int_values[t].copy_(step.extras.value_int)
        self.rnd_obs[t].copy_(selected)
        super().observe(step)

    # --- the update: PPO's loop with two returns and the predictor
    def both_final_values(self, truncated, final_obs):
        out = torch.zeros(2, *truncated.shape, device=self.device)
        if truncated.any():
            with torch.no_grad():
                v_ext, v_int = self.actor.values(final_obs[truncated])
                out[0][truncated], out[1][truncated] = v_ext, v_int
        return out

    def two_stream_advantages(self):
        """GAE of the extrinsic and the intrinsic stream (the novelty normalized by the running
        std of intrinsic returns), mixed ``ext_coef * A_ext + int_coef * A_int``; returns
        ``(adv, ret_ext, ret_int, int_rewards, whole)``. Shared with PPO-ICM."""
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

    def prepare_batch(self) -> RNDBatch:
        data = self.storage.data
        adv, ret_ext, ret_int, int_rewards, whole = self.two_stream_advantages()
        rnd_obs = self.rnd_obs.flatten(0, 1)
        self.rnd.update_obs_norm(rnd_obs)  # before the predictor trains on them (CleanRL's order)
        self._batch_stats = {"novelty": self.novelty.mean().item(), "int_reward": int_rewards.mean().item(),
                             "int_return_std": self.int_norm.std.item(), "ret_int": ret_int.mean().item()}
        b = data.flatten()
        return RNDBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret_ext.flatten(), whole,
                        values_int=self.int_values.flatten(), ret_int=ret_int.flatten(), rnd_obs=rnd_obs)

    def minibatch_losses(self, batch: RNDBatch, idx, clip: float):
        """``(ppo_part, v_loss_int, rnd_loss, stats)`` of one minibatch: PPO's loss with the
        extrinsic value (``pg_loss - ent_coef H + vf_coef v_loss``), the intrinsic value's
        regression and the predictor's loss; ``minibatch_step`` adds them
        (``vf_coef`` weighs the intrinsic value loss too)."""
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
        rnd_loss, _ = self.rnd.loss(take(batch.rnd_obs), cfg.rnd_fraction)
        stats = torch.cat([stats, torch.stack([v_loss_int.detach(), rnd_loss.detach()])])
        return ppo_part, v_loss_int, rnd_loss, stats

    def minibatch_step(self, batch: RNDBatch, idx, clip: float):
        ppo_part, v_loss_int, rnd_loss, stats = self.minibatch_losses(batch, idx, clip)
        return stats, self.applier(ppo_part + self.cfg.vf_coef * v_loss_int + rnd_loss)

    def applier(self, loss: torch.Tensor):
        def apply():
            self.optimizer.zero_grad()
            self.rnd_optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.rnd_optimizer.step()

        return apply

    def update(self, progress: float) -> dict[str, float]:
        return {**super().update(progress), **self._batch_stats}

    # --- state
    def extra_state(self):
        state = {**super().extra_state(), "env_steps": self.env_steps}
        if self.storage is not None and self.storage.step:
            s = self.storage.step
            state["rnd_rollout"] = [b[:s].clone() for b in (self.int_values, self.novelty, self.int_returns,
                                                             self.rnd_obs)]
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.env_steps = int(state["env_steps"])
        if self.storage is not None and "rnd_rollout" in state:
            for buf, saved in zip((self.int_values, self.novelty, self.int_returns, self.rnd_obs),
                                  state["rnd_rollout"]):
                buf[: saved.shape[0]] = saved
