"""REINFORCE (Williams 1992, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning"), with reward-to-go returns and an optional learned
baseline, discrete and continuous actions.

A member of the on-policy family (``corral.algos.onpolicy``) with A2C's parts
(``corral.algos.a2c.PolicyGradient``: the loss ``-A log pi``, value regression and entropy
bonus, the optimizers), the loop's batcher (one minibatch, the whole batch), and its own
returns and batches: Monte-Carlo returns over whole episodes in place of n-step returns:

* **Batches of episodes.** Steps are stored until ``batch_episodes`` episodes have ended
  (summed over the envs) or the storage of ``n_steps`` per env is full. The update uses
  every step whose episode ended in the batch; a column's steps after its last episode
  end (an episode still running) are left out of the loss, and that episode goes on under
  the updated policy: its remaining steps enter the next batch with their own complete
  returns. With one env (or ``batch_episodes`` well above ``num_envs``) little is left out;
  the ``tail_frac`` metric says how much. A batch with no complete episode at all is a
  user error (``n_steps`` below the episode length).
* **Returns.** ``G_t = r_t + gamma G_{t+1}`` within each episode (``discounted_returns``
  in ``corral.returns``, which starts every episode's recursion afresh). Where the env
  truncated an episode (a time limit), the return after the cut is unknown: with the
  baseline and ``bootstrap_truncated`` it is ``V(final_obs)`` (the return there is
  ``r + gamma V(final_obs)``); otherwise the return ends at the cut, as at a termination.
* **Baseline.** With ``baseline`` the advantage is ``G_t - V(s_t)`` and the value head
  regresses on ``G_t`` with its own loss (``vf_coef * v_loss``); the policy and value are
  separate MLPs, so the baseline loss moves only the value parameters (an image encoder
  is shared). Without it the advantage is ``G_t`` itself and the value head is not trained.

The episode count is read on the host once per step (``ready``); REINFORCE runs in-process
(``scheme.collectors=1``): collectors' fixed fragments do not end on episode boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from corral.algos.a2c import PolicyGradient, PolicyGradientConfig
from corral.algos.base import Step
from corral.algos.onpolicy import PPOBatch, normalized
from corral.config import option
from corral.errors import UserError
from corral.returns import discounted_returns


@dataclass
class REINFORCEConfig(PolicyGradientConfig):
    batch_episodes: int = option(8, "update once this many episodes have ended in the batch (summed over envs)",
                                 ge=1)
    n_steps: int = option(2048, "env steps per env the batch can hold (an update happens when it is full)", ge=1)
    lr: float = option(1e-3, "learning rate", gt=0)
    optimizer: Literal["rmsprop", "adam"] = option("adam", "adam or rmsprop (torch's)")
    baseline: bool = option(True, "learn V(s) and use G - V(s) as the advantage")
    bootstrap_truncated: bool = option(
        True, "with the baseline: where the env truncates an episode, continue its return with gamma V(final_obs) "
              "(off, or without the baseline: the return ends there)")
    normalize_advantage: bool = option(True, "normalize the advantages (returns without a baseline) over each batch")


class REINFORCE(PolicyGradient):
    name = "reinforce"
    Config = REINFORCEConfig

    def __init__(self, cfg: REINFORCEConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.ended = 0  # episodes ended in the batch so far
        self.last_batch = (0, 0)  # (steps used, steps left out) of the latest update

    @property
    def value_coef(self) -> float:
        return self.cfg.vf_coef if self.cfg.baseline else 0.0

    def scheme_config(self, collectors: int) -> dict:
        if collectors > 1:
            raise UserError("reinforce collects whole episodes in-process; set scheme.collectors=1 "
                            "(a2c or ppo run on collectors)")
        return {}

    def observe(self, step: Step):
        super().observe(step)
        self.ended += int(step.episode_ended().sum())

    def ready(self) -> bool:
        return self.ended >= self.cfg.batch_episodes or self.storage.full

    def prepare_batch(self) -> PPOBatch:
        cfg = self.cfg
        T = self.storage.step
        data = self.storage.data
        rewards, values = data.rewards[:T], data.values[:T]
        terminated, truncated = data.terminated[:T], data.truncated[:T]
        if cfg.baseline and cfg.bootstrap_truncated:
            next_values = self.final_values(truncated, data.final_obs[:T])
        else:
            next_values = torch.zeros_like(rewards)
        with torch.no_grad():
            returns = discounted_returns(rewards, terminated, truncated, next_values, cfg.gamma)
        # a step is used when its episode ended in the batch: an end at or after it in its column
        ended = (terminated | truncated).int()
        complete = ended.flip(0).cumsum(0).flip(0) > 0
        used = int(complete.sum())
        if used == 0:
            raise UserError(f"reinforce: no episode ended within n_steps={cfg.n_steps} steps per env; raise "
                            "reinforce.n_steps above the env's episode length")
        self.last_batch = (used, complete.numel() - used)
        m = complete.flatten()
        obs, actions = data.obs[:T].flatten(0, 1)[m], data.actions[:T].flatten(0, 1)[m]
        log_probs, values, ret = data.log_probs[:T].flatten()[m], values.flatten()[m], returns.flatten()[m]
        adv = ret - values if cfg.baseline else ret
        if cfg.normalize_advantage:
            adv = normalized(adv)
        return PPOBatch(obs, actions, log_probs, values, adv, ret, whole=True)

    def update(self, progress: float) -> dict[str, float]:
        stats = super().update(progress)
        used, left = self.last_batch
        stats.update(batch_episodes=float(self.ended), batch_steps=float(used), tail_frac=left / (used + left))
        self.ended = 0
        return stats

    def extra_state(self):
        return {**super().extra_state(), "ended": self.ended}

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.ended = int(state["ended"])

