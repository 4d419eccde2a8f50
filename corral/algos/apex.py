"""Ape-X (Horgan et al. 2018): distributed prioritized experience replay, as a small diff
over DQN, C51 (``apex_rainbow``) and TD3/DDPG.

What changes from the base algorithms:

* Each env gets its own exploration: Ape-X DQN's epsilon ladder
  ``eps_i = eps_base ** (1 + eps_alpha * i / (G - 1))`` and Ape-X DDPG's Gaussian noise
  ladder ``sigma_i = noise_max * (noise_min / noise_max) ** (i / (G - 1))``, with ``i``
  the env's index among all ``G = collectors x num_envs`` envs.
* Collectors score their own transitions (``initial_priorities``: n-step TD errors from
  their copy of the networks, bootstrapping with the online network since they hold no
  target), so new data enters the replay at a useful priority instead of the maximum.
* The replay lives in a server the collectors write to (``replay_server = True``); the
  learner samples from it, sends back priorities and broadcasts. The scheme runs that
  loop; nothing here knows where the pieces run. With ``scheme.collectors=1`` the same
  algorithm runs in-process on a local prioritized replay.
* The observation normalizer is updated where observations are seen, in ``explore``
  (collectors report what they saw; the learner merges and broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from corral.algos.base import Action
from corral.algos.distributional import C51, C51Config, categorical_projection
from corral.algos.dqn import DQN, DQNConfig
from corral.algos.td3 import TD3, TD3Config
from corral.config import option


def ladder(first: float, last: float, count: int, device) -> torch.Tensor:
    """``count`` values spaced geometrically from ``first`` to ``last``."""
    if count <= 1:
        return torch.full((1,), float(first), device=device)
    i = torch.arange(count, dtype=torch.float64, device=device)
    return (first * (last / first) ** (i / (count - 1))).float()


def nstep_window(data, gamma: float, n: int):
    """Per step of a fragment: the n-step discounted reward, the observation it bootstraps
    from and the discount, with windows ending at an episode end or the fragment's last
    step (exactly the targets the replay buffer builds from the same fragment)."""
    T, N = data.reward.shape
    done = data.terminated | data.boundary_truncated()
    final = data.true_next_obs()
    t = torch.arange(T).unsqueeze(1).expand(T, N)
    ret = torch.zeros(T, N)
    last = t.clone()
    alive = torch.ones(T, N, dtype=torch.bool)
    for k in range(n):
        idx = (t + k).clamp(max=T - 1)
        valid = alive & (t + k < T)
        ret += torch.where(valid, (gamma ** k) * data.reward.gather(0, idx), 0.0)
        last = torch.where(valid, idx, last)
        alive = valid & ~done.gather(0, idx)
    length = (last - t + 1).float()
    next_obs = final[last, torch.arange(N).expand(T, N)]
    discount = gamma ** length * (~data.terminated.gather(0, last)).float()
    return ret, next_obs, discount


class ApexMixin:
    """What Ape-X adds to an off-policy algorithm (see the module docstring)."""

    replay_server = True
    worker, workers = 0, 1

    def set_worker(self, index: int, count: int) -> None:
        self.worker, self.workers = index, count

    def env_ladder(self, first: float, last: float) -> torch.Tensor:
        """This collector's slice of the ladder over every env of the run."""
        n = self.num_envs
        full = ladder(first, last, self.workers * n, self.device)
        return full[self.worker * n:(self.worker + 1) * n]

    def normalizer(self):
        return None  # explore updates it (OffPolicy.observe would count every observation twice)

    def explore(self, obs):
        self.actor.enc.norm.update(obs)
        return super().explore(obs)

    def fragment_length(self) -> int:
        return self.cfg.rollout_fragment

    def advance(self, env_steps: int) -> None:
        """The counters ``observe`` keeps, for a learner that only hears that collectors
        wrote ``env_steps`` transitions to the replay server."""
        cfg = self.cfg
        before = self.env_steps
        self.env_steps += env_steps
        self.vector_steps += env_steps // self.num_envs
        self._since_update += env_steps // self.num_envs
        interval = cfg.target_update_interval
        if self.env_steps >= cfg.learning_starts and self.env_steps // interval > before // interval:
            self.target_update()

    def initial_priorities(self, data) -> torch.Tensor:
        ret, next_obs, discount = nstep_window(data, self.cfg.gamma, self.cfg.n_step)
        td = self.td_errors(data.obs[:-1].flatten(0, 1), data.extras.action.flatten(0, 1),
                            ret.flatten(), next_obs.flatten(0, 1), discount.flatten())
        return td.abs().view_as(ret)


@dataclass
class ApexDQNConfig(DQNConfig):
    rollout_fragment: int = option(64, "env steps per env in a fragment sent to the replay", ge=1)
    prefetch: int = option(16, "batches the learner draws from the replay server per request (staler priorities)", ge=1)
    eps_base: float = option(0.4, "epsilon ladder: eps_i = eps_base ** (1 + eps_alpha * i / (envs - 1))",
                             ge=0, le=1)
    eps_alpha: float = option(7.0, "epsilon ladder exponent range", ge=0)
    prioritized: bool = option(True, "prioritized replay (proportional, sum-tree)")
    double: bool = option(True, "Double DQN targets")
    dueling: bool = option(True, "dueling head")
    n_step: int = option(3, "n-step returns", ge=1)
    target_update_interval: int = option(2500, "update the target network every this many gradient steps "
                                                "(at the end of the update that reaches them)", ge=1)

    # DQN's epsilon schedule is not Ape-X's: each env keeps its fixed rung of the ladder
    # (eps_base, eps_alpha) for the whole run, so the schedule's options are taken out (a
    # ClassVar is not a dataclass field: the keys are refused as unknown).
    exploration_fraction: ClassVar[None] = None
    exploration_initial_eps: ClassVar[None] = None
    exploration_final_eps: ClassVar[None] = None


class ApexDQN(ApexMixin, DQN):
    name = "apex_dqn"
    Config = ApexDQNConfig

    @property
    def epsilon(self) -> torch.Tensor:
        c = self.cfg
        return self.env_ladder(c.eps_base, c.eps_base ** (1.0 + c.eps_alpha))

    def td_errors(self, obs, action, ret, next_obs, discount):
        q = self.actor.q(obs).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        target = ret + discount * self.actor.q(next_obs).max(-1).values
        return q - target

    def target_update(self) -> None:
        """``observe``/``advance`` call this on the env-step clock; Ape-X's target follows
        the learner's own clock instead (``update``)."""

    def update(self, progress):
        before = self.grad_steps
        out = super().update(progress)
        # between updates, so every gradient step of an update sees one target network
        interval = self.cfg.target_update_interval
        if self.grad_steps // interval > before // interval:
            self.polyak(self.target, self.actor, self.cfg.tau, self._pairs)
        out["epsilon"] = float(self.epsilon.mean())
        return out


@dataclass
class ApexTD3Config(TD3Config):
    rollout_fragment: int = option(64, "env steps per env in a fragment sent to the replay", ge=1)
    prefetch: int = option(16, "batches the learner draws from the replay server per request (staler priorities)", ge=1)
    noise_max: float = option(0.5, "Gaussian noise ladder: the largest std (unit action scale)", ge=0)
    noise_min: float = option(0.05, "Gaussian noise ladder: the smallest std", ge=0)
    prioritized: bool = option(True, "prioritized replay (proportional, sum-tree)")

    # TD3's one exploration std (and its OU option) is replaced by the per-env ladder (noise_max, noise_min); taken
    # out of the options (a ClassVar is not a dataclass field: the key is refused as unknown)
    exploration_noise: ClassVar[None] = None
    exploration_noise_type: ClassVar[None] = None


class ApexTD3(ApexMixin, TD3):
    name = "apex_td3"
    Config = ApexTD3Config
    acting = ("actor", "critics")  # collectors score their transitions with the critics too

    def explore(self, obs):
        self.actor.enc.norm.update(obs)
        box = self.actor.box
        if self.env_steps < self.cfg.learning_starts:  # uniform warm-up, as TD3
            unit = torch.rand(obs.shape[0], box.dim, generator=self.rng["noise"], device=self.device) * 2 - 1
        else:
            unit = self.actor(self.actor.enc(obs))
            noise = torch.randn(unit.shape, generator=self.rng["noise"], device=self.device)
            sigma = self.env_ladder(self.cfg.noise_max, self.cfg.noise_min).unsqueeze(-1)
            unit = (unit + sigma * noise).clamp(-1.0, 1.0)
        env_action = box.to_env(unit)
        return env_action, Action(env_action)

    def td_errors(self, obs, action, ret, next_obs, discount):
        enc = self.actor.enc
        o, no = enc(obs), enc(next_obs)
        view = self.critics.view
        q = self.critics(view(obs, o), self.actor.box.to_unit(action))
        target = ret + discount * self.critics(view(next_obs, no), self.actor(no)).min(0).values
        return (q - target).abs().max(0).values


@dataclass
class ApexRainbowConfig(ApexDQNConfig, C51Config):
    """Ape-X's distributed prioritized replay over C51 (double, dueling, n-step 3, PER).
    Noisy nets stay off: the epsilon ladder explores, as in Ape-X."""

    loss: ClassVar[None] = None  # C51's cross-entropy (ApexDQNConfig's fields come after C51Config's)


class ApexRainbow(ApexDQN, C51):
    name = "apex_rainbow"
    Config = ApexRainbowConfig

    @torch.no_grad()
    def td_errors(self, obs, action, ret, next_obs, discount):
        """The collector's priority: C51's cross-entropy against the projected n-step target,
        bootstrapping from its own (online) copy, the network that picks the next action too."""
        net, B = self.actor, obs.shape[0]
        out = net.out(torch.cat([obs, next_obs]))
        next_probs = out[B:].softmax(-1)
        rows = torch.arange(B, device=out.device)
        a = (next_probs * net.support).sum(-1).argmax(-1)
        target = categorical_projection(next_probs[rows, a], ret, discount, net.support)
        return -(target * out[:B][rows, action.long()].log_softmax(-1)).sum(-1)
