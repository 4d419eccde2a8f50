"""PPO with Random Network Distillation (``ppo_rnd``; Burda et al. 2018, "Exploration by
Random Network Distillation").

A bonus on PPO's loop (``corral.algos.ppo_bonus``: two value heads, two returns, the
warm-up, shared with PPO-ICM). The exploration bonus is RND's
(``corral.exploration.rnd``): the intrinsic reward of step t is the predictor's error on the
observation it led to, divided by a running std of *intrinsic returns* filtered along time
per env (``IntrinsicReturnNormalizer``). What changes against PPO (the predictor is this
file's hooks; the rest is ``BonusPPO``'s):

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

import torch

from corral.algos.base import Step
from corral.algos.ppo import STAT_NAMES
from corral.algos.ppo_bonus import BonusPPO, BonusPPOConfig
from corral.config import option
from corral.exploration.rnd import RND
from corral.optim import FlatAdam


@dataclass
class PPORNDConfig(BonusPPOConfig):
    rnd_fraction: float = option(0.25, "fraction of each minibatch that trains the predictor (drawn per sample)",
                                 gt=0, le=1)
    rnd_lr: float | None = option(None, "the predictor's Adam learning rate (None: lr; not scheduled)", gt=0)
    rnd_hidden: tuple[int, ...] = option((64, 64), "hidden sizes of RND's target MLP on flat observations "
                                                   "(the predictor gets one more layer)", ge=1)
    rnd_features: int = option(64, "output size of RND's target and predictor (the paper: 512 on Atari)", ge=1)
    rnd_frames: int = option(1, "image observations: the newest this many stacked frames RND sees (0: all)", ge=0)
    rnd_obs_clip: float = option(5.0, "clip RND's normalized observations to +-this", gt=0)


class PPORND(BonusPPO):
    name = "ppo_rnd"
    Config = PPORNDConfig
    networks = ("actor", "ret_norm", "rnd", "int_norm")
    optimizers = ("optimizer", "rnd_optimizer")
    STATS = STAT_NAMES + ("v_loss_int", "rnd_loss")
    rollout_key = "rnd_rollout"
    box_reason = "RND's networks read them through a running mean/std"

    def __init__(self, cfg: PPORNDConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"] + 1)  # not the actor's draws
            self.rnd = RND(obs_space, tuple(cfg.rnd_hidden), cfg.rnd_features, cfg.rnd_obs_clip, cfg.rnd_frames,
                           generator=rng["rnd"]).to(device)
        self.rnd_optimizer = None
        if self.learns:
            self.rnd_optimizer = FlatAdam(self.rnd.predictor.parameters(), lr=cfg.rnd_lr or cfg.lr, eps=cfg.adam_eps,
                                          max_grad_norm=cfg.max_grad_norm)
        if self.stores:
            dtype = torch.uint8 if self.rnd.image else torch.float32
            self.rnd_obs = torch.zeros(cfg.n_steps, num_envs, *self.rnd.in_shape, dtype=dtype, device=device)

    # --- the bonus: the predictor's error on the observation each step led to
    def bonus_warmup(self, step: Step) -> None:
        self.rnd.update_obs_norm(step.final_obs)

    def bonus_reward(self, step: Step, t: int) -> torch.Tensor:
        selected = self.rnd.select(step.final_obs)
        self.rnd_obs[t].copy_(selected)
        return self.rnd.novelty(selected)

    def bonus_batch(self) -> dict[str, torch.Tensor]:
        rnd_obs = self.rnd_obs.flatten(0, 1)
        self.rnd.update_obs_norm(rnd_obs)  # before the predictor trains on them (CleanRL's order)
        return {"rnd_obs": rnd_obs}

    def bonus_loss(self, bonus: dict[str, torch.Tensor], actions: torch.Tensor):
        """The predictor's loss on a ``rnd_fraction`` of the minibatch (the target never changes)."""
        rnd_loss, _ = self.rnd.loss(bonus["rnd_obs"], self.cfg.rnd_fraction)
        return rnd_loss, rnd_loss.detach().unsqueeze(0)

    def bonus_buffers(self) -> tuple[torch.Tensor, ...]:
        return (self.rnd_obs,)
