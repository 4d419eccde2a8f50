"""PPO with the Intrinsic Curiosity Module (``ppo_icm``; Pathak, Agrawal, Efros and Darrell
2017, "Curiosity-driven Exploration by Self-supervised Prediction"), as Deep RL Zoo pairs it
with PPO.

PPO-RND's algorithm (``corral.algos.ppo_rnd``) with RND's bonus replaced by ICM's
(``corral.exploration.icm``): ``PPOICM`` subclasses ``PPORND`` and keeps, unchanged, its
two-value-head actor-critic (``make_actor``), its acting with the warm-up (``explore``,
``set_env_steps``), its per-env intrinsic-return filter as column state (``column_state``,
``IntrinsicReturnNormalizer``: the curiosity reward is divided by the running std of intrinsic
returns, as RND's), the truncation bootstraps of both heads (``both_final_values``), the
minibatch step and the update. What it replaces is what reads RND:

* **The bonus.** ``r_int(t) = eta / 2 ||f(phi(s_t), a_t) - phi(s_t+1)||^2`` of the step's
  observation, action and true next observation (``final_obs``), computed as the learner
  observes the step (ICM only changes in ``update``, so this equals computing it over the
  finished rollout), then normalised as PPO-RND's.
* **The ICM's training.** In the same minibatches as PPO, on every sample, with its own Adam
  (``icm_lr``) and gradient clip: ``(1 - icm_beta) L_inverse + icm_beta L_forward``. The ICM is
  not summed into the policy's loss with a ``lambda``; no parameter is shared between the
  actor-critic and the ICM (its encoder is its own), so each loss moves only its own side.
  Before the epochs, the rollout's observations are folded into the ICM's observation
  normaliser (as PPO-RND does for RND's).
* **Warm-up**: as PPO-RND's, the first ``warmup_steps`` only feed the ICM's normaliser.

``__init__``, ``observe``, ``prepare_batch``, ``minibatch_losses``, ``applier`` and the rollout
part of ``extra_state`` are the ones that name RND in PPO-RND; they are written here for the
ICM (the constructor goes to PPO's past PPO-RND's, which would build an RND). Gradient workers
are not wired (``grad_sharding = None``, as PPO-RND).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch
import torch.nn.functional as F

from corral.algos.base import Step
from corral.algos.ppo import STAT_NAMES, PPOBatch, PPOConfig, ppo_loss
from corral.algos.ppo_rnd import PPORND
from corral.algos.recurrent_ppo import _Outputs
from corral.config import option
from corral.errors import UserError
from corral.exploration.icm import ICM
from corral.exploration.rnd import IntrinsicReturnNormalizer
from corral.optim import FlatAdam


@dataclass
class PPOICMConfig(PPOConfig):
    gamma: float = option(0.999, "extrinsic discount factor (episodic)", ge=0, le=1)
    int_gamma: float = option(0.99, "intrinsic discount factor (also the intrinsic-return filter's)", ge=0, le=1)
    int_episodic: bool = option(False, "cut intrinsic returns where an episode terminates")
    ext_coef: float = option(2.0, "weight of the extrinsic advantage in the policy's advantage", ge=0)
    int_coef: float = option(1.0, "weight of the intrinsic advantage in the policy's advantage", ge=0)
    icm_lr: float | None = option(None, "the ICM's Adam learning rate (None: lr; not scheduled)", gt=0)
    icm_hidden: tuple[int, ...] = option((64, 64), "hidden sizes of the ICM's encoder on flat observations (the "
                                                   "inverse and forward models: one layer of the last size)", ge=1)
    icm_features: int = option(64, "size of the ICM's features phi(s) (the paper: 288 on pixels)", ge=1)
    icm_beta: float = option(0.2, "weight of the forward loss (1 - beta: the inverse loss)", ge=0, le=1)
    icm_eta: float = option(1.0, "intrinsic reward scale: eta / 2 ||f(phi(s), a) - phi(s')||^2", gt=0)
    icm_obs_clip: float = option(5.0, "clip the ICM's normalized observations to +-this", gt=0)
    warmup_steps: int = option(1024, "env steps of random actions that only feed the ICM's observation "
                                     "normaliser before learning (counted in the run's steps)", ge=0)


@dataclass
class ICMBatch(PPOBatch):
    """PPO's flat batch plus the intrinsic stream and the ICM's transitions."""

    values_int: torch.Tensor = None
    ret_int: torch.Tensor = None
    icm_obs: torch.Tensor = None  # [B, *ICM.in_shape]: s_t as the ICM reads it
    icm_next: torch.Tensor = None  # [B, *ICM.in_shape]: s_t+1 (the true next observation)


class PPOICM(PPORND):
    name = "ppo_icm"
    grad_sharding = None  # PPO's minibatch sharding does not cover this update
    user_actor = False  # builds its own actor (PPO-RND's make_actor)
    Config = PPOICMConfig
    networks = ("actor", "ret_norm", "icm", "int_norm")
    optimizers = ("optimizer", "icm_optimizer")
    STATS = STAT_NAMES + ("v_loss_int", "icm_loss", "inverse_loss", "forward_loss")

    def __init__(self, cfg: PPOICMConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if not isinstance(obs_space, gym.spaces.Box):
            raise UserError(f"ppo_icm needs Box observations (vectors or images), got {obs_space}; the ICM's "
                            "encoder reads them through a running mean/std")
        if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box)):
            raise UserError(f"ppo_icm takes Discrete, MultiDiscrete or Box actions, got {act_space}")
        super(PPORND, self).__init__(cfg, obs_space, act_space, num_envs, device, rng, role)  # PPO's: no RND
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"] + 2)  # not the actor's draws
            self.icm = ICM(obs_space, act_space, tuple(cfg.icm_hidden), cfg.icm_features, cfg.icm_beta,
                           cfg.icm_eta, cfg.icm_obs_clip).to(device)
        self.int_norm = IntrinsicReturnNormalizer(num_envs, cfg.int_gamma).to(device)
        self.icm_optimizer = None
        if self.learns:
            self.icm_optimizer = FlatAdam(self.icm.parameters(), lr=cfg.icm_lr or cfg.lr, eps=cfg.adam_eps,
                                          max_grad_norm=cfg.max_grad_norm)
        if self.stores:
            T, N = cfg.n_steps, num_envs
            dtype = torch.uint8 if self.icm.image else torch.float32
            self.int_values = torch.zeros(T, N, device=device)
            self.novelty = torch.zeros(T, N, device=device)  # raw curiosity rewards
            self.int_returns = torch.zeros(T, N, device=device)
            self.icm_obs = torch.zeros(T, N, *self.icm.in_shape, dtype=dtype, device=device)
            self.icm_next = torch.zeros(T, N, *self.icm.in_shape, dtype=dtype, device=device)
        self.env_steps = 0
        self._batch_stats: dict[str, float] = {}

    def _rollout_buffers(self):
        return self.int_values, self.novelty, self.int_returns, self.icm_obs, self.icm_next

    # --- storing
    def observe(self, step: Step):
        n = step.reward.shape[0]
        warm = self.env_steps < self.cfg.warmup_steps  # PPO-RND's rule (collectors' flag while it can arrive)
        if not warm and self.env_steps < self.cfg.warmup_steps + self.cfg.n_steps * n:
            warm = bool(step.extras.warmup.any())
        self.env_steps += n
        if warm:
            self.icm.update_obs_norm(step.final_obs)
            self._last_obs = step.next_obs
            return
        t = self.storage.step
        obs, nxt = self.icm.select(step.obs), self.icm.select(step.final_obs)
        novelty = self.icm.reward(obs, nxt, step.extras.action)
        self.novelty[t].copy_(novelty)
        self.int_returns[t].copy_(self.int_norm.step(novelty))
        self.int_values[t].copy_(step.extras.value_int)
        self.icm_obs[t].copy_(obs)
        self.icm_next[t].copy_(nxt)
        super(PPORND, self).observe(step)  # PPO's storage

    # --- the update
    def prepare_batch(self) -> ICMBatch:
        data = self.storage.data
        adv, ret_ext, ret_int, int_rewards, whole = self.two_stream_advantages()
        icm_obs, icm_next = self.icm_obs.flatten(0, 1), self.icm_next.flatten(0, 1)
        self.icm.update_obs_norm(icm_next)  # each step's s_t+1 once (s_t is the previous step's, or a reset)
        self._batch_stats = {"novelty": self.novelty.mean().item(), "int_reward": int_rewards.mean().item(),
                             "int_return_std": self.int_norm.std.item(), "ret_int": ret_int.mean().item()}
        b = data.flatten()
        return ICMBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret_ext.flatten(), whole,
                        values_int=self.int_values.flatten(), ret_int=ret_int.flatten(), icm_obs=icm_obs,
                        icm_next=icm_next)

    def minibatch_losses(self, batch: ICMBatch, idx, clip: float):
        """``(ppo_part, v_loss_int, icm_loss, stats)``: PPO's loss with the extrinsic value, the
        intrinsic value's regression and the ICM's loss (PPO-RND's ``minibatch_step`` adds them;
        the ICM's parameters are its optimizer's alone)."""
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
        icm_loss, inv, fwd = self.icm.losses(take(batch.icm_obs), take(batch.icm_next), take(batch.actions))
        stats = torch.cat([stats, torch.stack([v_loss_int.detach(), icm_loss.detach(), inv.detach(),
                                               fwd.detach()])])
        return ppo_part, v_loss_int, icm_loss, stats

    def applier(self, loss: torch.Tensor):
        def apply():
            self.optimizer.zero_grad()
            self.icm_optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.icm_optimizer.step()

        return apply

    # --- state
    def extra_state(self):
        state = {**super(PPORND, self).extra_state(), "env_steps": self.env_steps}
        if self.storage is not None and self.storage.step:
            s = self.storage.step
            state["icm_rollout"] = [b[:s].clone() for b in self._rollout_buffers()]
        return state

    def load_extra_state(self, state):
        super(PPORND, self).load_extra_state(state)
        self.env_steps = int(state["env_steps"])
        if self.storage is not None and "icm_rollout" in state:
            for buf, saved in zip(self._rollout_buffers(), state["icm_rollout"]):
                buf[: saved.shape[0]] = saved
