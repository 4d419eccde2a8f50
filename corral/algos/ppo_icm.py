"""PPO with the Intrinsic Curiosity Module (``ppo_icm``; Pathak, Agrawal, Efros and Darrell
2017, "Curiosity-driven Exploration by Self-supervised Prediction"), as Deep RL Zoo pairs it
with PPO.

ICM's bonus (``corral.exploration.icm``) on the bonus-agnostic loop PPO-RND runs on too
(``corral.algos.ppo_bonus``): its two-value-head actor-critic, its acting with the warm-up,
its per-env intrinsic-return filter as column state (``IntrinsicReturnNormalizer``: the
curiosity reward is divided by the running std of intrinsic returns, as RND's), the truncation
bootstraps of both heads, the two-stream advantages, the minibatch step and the update. What
this file supplies are the bonus's hooks:

* **The bonus** (``bonus_reward``). ``r_int(t) = eta / 2 ||f(phi(s_t), a_t) - phi(s_t+1)||^2``
  of the step's observation, action and true next observation (``final_obs``), computed as the
  learner observes the step (ICM only changes in ``update``, so this equals computing it over
  the finished rollout), then normalised as PPO-RND's.
* **The ICM's training** (``bonus_loss``). In the same minibatches as PPO, on every sample,
  with its own Adam (``icm_lr``) and gradient clip: ``(1 - icm_beta) L_inverse + icm_beta
  L_forward``. The ICM is not summed into the policy's loss with a ``lambda``; no parameter is
  shared between the actor-critic and the ICM (its encoder is its own), so each loss moves only
  its own side. Before the epochs, the rollout's observations are folded into the ICM's
  observation normaliser (``bonus_batch``, as PPO-RND does for RND's).
* **Warm-up** (``bonus_warmup``): the first ``warmup_steps`` only feed the ICM's normaliser.

Gradient workers are not wired (``grad_sharding = None``, as PPO-RND).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch

from corral.algos.base import Step
from corral.algos.ppo import STAT_NAMES
from corral.algos.ppo_bonus import BonusPPO, BonusPPOConfig
from corral.config import option
from corral.errors import UserError
from corral.exploration.icm import ICM
from corral.optim import FlatAdam


@dataclass
class PPOICMConfig(BonusPPOConfig):
    int_episodic: bool = option(False, "cut intrinsic returns where an episode terminates")
    icm_lr: float | None = option(None, "the ICM's Adam learning rate (None: lr; not scheduled)", gt=0)
    icm_hidden: tuple[int, ...] = option((64, 64), "hidden sizes of the ICM's encoder on flat observations (the "
                                                   "inverse and forward models: one layer of the last size)", ge=1)
    icm_features: int = option(64, "size of the ICM's features phi(s) (the paper: 288 on pixels)", ge=1)
    icm_beta: float = option(0.2, "weight of the forward loss (1 - beta: the inverse loss)", ge=0, le=1)
    icm_eta: float = option(1.0, "intrinsic reward scale: eta / 2 ||f(phi(s), a) - phi(s')||^2", gt=0)
    icm_obs_clip: float = option(5.0, "clip the ICM's normalized observations to +-this", gt=0)


class PPOICM(BonusPPO):
    name = "ppo_icm"
    Config = PPOICMConfig
    networks = ("actor", "ret_norm", "icm", "int_norm")
    optimizers = ("optimizer", "icm_optimizer")
    STATS = STAT_NAMES + ("v_loss_int", "icm_loss", "inverse_loss", "forward_loss")
    rollout_key = "icm_rollout"
    box_reason = "the ICM's encoder reads them through a running mean/std"

    def __init__(self, cfg: PPOICMConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"] + 2)  # not the actor's draws
            self.icm = ICM(obs_space, act_space, tuple(cfg.icm_hidden), cfg.icm_features, cfg.icm_beta,
                           cfg.icm_eta, cfg.icm_obs_clip).to(device)
        self.icm_optimizer = None
        if self.learns:
            self.icm_optimizer = FlatAdam(self.icm.parameters(), lr=cfg.icm_lr or cfg.lr, eps=cfg.adam_eps,
                                          max_grad_norm=cfg.max_grad_norm)
        if self.stores:
            T, N = cfg.n_steps, num_envs
            dtype = torch.uint8 if self.icm.image else torch.float32
            self.icm_obs = torch.zeros(T, N, *self.icm.in_shape, dtype=dtype, device=device)
            self.icm_next = torch.zeros(T, N, *self.icm.in_shape, dtype=dtype, device=device)

    def check_spaces(self, obs_space, act_space) -> None:
        super().check_spaces(obs_space, act_space)
        if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box)):
            raise UserError(f"ppo_icm takes Discrete, MultiDiscrete or Box actions, got {act_space}")

    # --- the bonus: the forward model's error in the inverse model's feature space
    def bonus_warmup(self, step: Step) -> None:
        self.icm.update_obs_norm(step.final_obs)

    def bonus_reward(self, step: Step, t: int) -> torch.Tensor:
        obs, nxt = self.icm.select(step.obs), self.icm.select(step.final_obs)
        self.icm_obs[t].copy_(obs)
        self.icm_next[t].copy_(nxt)
        return self.icm.reward(obs, nxt, step.extras.action)

    def bonus_batch(self) -> dict[str, torch.Tensor]:
        icm_obs, icm_next = self.icm_obs.flatten(0, 1), self.icm_next.flatten(0, 1)
        self.icm.update_obs_norm(icm_next)  # each step's s_t+1 once (s_t is the previous step's, or a reset)
        return {"icm_obs": icm_obs, "icm_next": icm_next}

    def bonus_loss(self, bonus: dict[str, torch.Tensor], actions: torch.Tensor):
        """``(1 - icm_beta) L_inverse + icm_beta L_forward`` on every sample of the minibatch."""
        icm_loss, inv, fwd = self.icm.losses(bonus["icm_obs"], bonus["icm_next"], actions)
        return icm_loss, torch.stack([icm_loss.detach(), inv.detach(), fwd.detach()])

    def bonus_buffers(self) -> tuple[torch.Tensor, ...]:
        return self.icm_obs, self.icm_next
