"""DQN (Mnih et al. 2015) and the variants that are flags on it: Double DQN
(van Hasselt et al. 2016), dueling heads (Wang et al. 2016), n-step returns,
prioritized replay (Schaul et al. 2016) and noisy nets (Fortunato et al. 2018). Presets ``dqn``, ``double_dqn``,
``dueling_dqn``, ``d3qn`` and their ``per_`` forms are this one file with flags set.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from corral.actors.distributional import ZNetwork
from corral.actors.offpolicy import QNetwork
from corral.algos.base import Action
from corral.algos.offpolicy import OffPolicy, OffPolicyConfig
from corral.config import option
from corral.errors import UserError
from corral.kernels.direct import direct_chain, huber_direct_step
from corral.kernels.greedy import epsilon_greedy_numpy
from corral.kernels.registry import Replaces


@dataclass
class DQNConfig(OffPolicyConfig):
    double: bool = option(False, "Double DQN: the online net picks the next action, the target net scores it")
    dueling: bool = option(False, "dueling head: Q = V + A - mean(A)")
    loss: Literal["huber", "mse"] = option("huber", "TD loss: huber (smooth L1) or mse")
    exploration_fraction: float = option(0.1, "fraction of the run over which epsilon decays", ge=0, le=1)
    exploration_initial_eps: float = option(1.0, "epsilon at the start", ge=0, le=1)
    exploration_final_eps: float = option(0.05, "epsilon after the decay", ge=0, le=1)
    # DQN's classic cadence: hard target copies, sparse updates
    tau: float = option(1.0, "Polyak coefficient for the target network (1.0: hard copy)", gt=0, le=1)
    target_update_interval: int = option(10_000, "update the target network every this many env steps", ge=1)
    train_freq: int = option(4, "update every this many vector steps", ge=1)
    learning_starts: int = option(1000, "env steps collected before the first update", ge=0)
    batch_size: int = option(32, "transitions per gradient step", ge=1)
    lr: float = option(1e-4, "Adam learning rate", gt=0)
    max_grad_norm: float | None = option(10.0, "global gradient norm clip (None: off)", gt=0)
    noisy: bool = option(False, "noisy nets: NoisyLinear layers after the encoder explore instead of epsilon "
                                "(epsilon is 0; evaluation uses the mean weights)")
    noisy_sigma0: float = option(0.5, "noisy nets: initial noise scale sigma_0 (sigma = sigma_0 / sqrt(fan_in))", gt=0)



def linear_epsilon(cfg, env_steps: int, total_steps: int) -> float:
    """The replay family's epsilon schedule (a part: DQN, R2D2, QMIX): ``exploration_initial_eps``
    to ``exploration_final_eps`` linearly over the first ``exploration_fraction`` of the run."""
    frac = min(1.0, env_steps / max(1.0, cfg.exploration_fraction * total_steps))
    return cfg.exploration_initial_eps + frac * (cfg.exploration_final_eps - cfg.exploration_initial_eps)


class DQN(OffPolicy):
    name = "dqn"
    Config = DQNConfig
    value_method = True
    networks = ("actor", "target")
    optimizers = ("optimizer",)
    capturable = True

    def __init__(self, cfg: DQNConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        import gymnasium as gym

        if not isinstance(act_space, gym.spaces.Discrete):
            raise UserError(f"dqn needs a Discrete action space, got {act_space}; use sac, td3 or ddpg for Box actions")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.actor = self._build(lambda: self.make_q_network().to(device))
        self.target = copy.deepcopy(self.actor).requires_grad_(False)
        self.optimizer = self._optimizer(self.actor.parameters(), cfg.lr)
        self.n_actions = int(act_space.n)
        self._numpy_net = None  # see _acts_in_numpy
        self._chain = None  # see _direct_chain

    def make_q_network(self) -> torch.nn.Module:
        """The online Q-network (the target is its copy). A distributional subclass returns
        its own network; acting and Ape-X read only ``q(obs) -> [B, actions]``."""
        cfg = self.cfg
        if cfg.noisy:
            return ZNetwork(self.obs_space, int(self.act_space.n), 1, **self.net_kwargs())
        return QNetwork(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.dueling,
                        cfg.normalize_obs)

    def net_kwargs(self) -> dict:
        """The options every DQN-family network takes (``corral.actors.distributional``)."""
        cfg = self.cfg
        return dict(hidden=tuple(cfg.hidden), activation=cfg.activation, dueling=cfg.dueling, noisy=cfg.noisy,
                    sigma0=cfg.noisy_sigma0, normalize_obs=cfg.normalize_obs)

    def normalizer(self):
        return self.actor.enc.norm

    @property
    def epsilon(self) -> float:
        return 0.0 if self.cfg.noisy else linear_epsilon(self.cfg, self.env_steps, self.total_steps)

    def explore(self, obs):
        n = obs.shape[0]
        g = self.rng["noise"]
        random_action = torch.randint(self.n_actions, (n,), generator=g, device=self.device)
        u = torch.rand(n, generator=g, device=self.device)
        if self._acts_in_numpy(obs):  # the kernel: the same draws and choices, decided in numpy
            action = epsilon_greedy_numpy(self.actor, obs, random_action, u, self.epsilon)
            return action, Action(action)
        explore_mask = u < self.epsilon
        if bool(explore_mask.all()):  # early on, skip the forward pass entirely
            action = random_action
        else:
            if self.cfg.noisy:  # a fresh draw of the weights' noise every acting step
                self.actor.reset_noise(self.rng["noisy"])
            action = torch.where(explore_mask, random_action, self.greedy(obs))
        return action, Action(action)

    def greedy(self, obs) -> torch.Tensor:
        """The exploring policy's greedy actions."""
        if self._acts_in_numpy(obs):
            return torch.from_numpy(self.actor.greedy_numpy(obs))
        return self.actor.q(obs).argmax(-1)

    # the fast path of acting (``corral.kernels.greedy``): ``explore`` and ``greedy`` decided in
    # numpy on a few CPU rows; a subclass with its own ``greedy`` acts through it instead
    numpy_acting = Replaces(epsilon_greedy_numpy, greedy=greedy)

    def _acts_in_numpy(self, obs) -> bool:
        """Whether acting on ``obs`` goes through the net's ``greedy_numpy``: a few rows on CPU,
        a net that is one chain of linear layers (no noise to draw)."""
        if self._numpy_net is None:  # found once: a net's layout never changes
            self._numpy_net = (not self.cfg.noisy and isinstance(self.actor, (QNetwork, ZNetwork))
                               and self.numpy_acting.in_force(type(self)) and self.actor.chain() is not None)
        return self._numpy_net and obs.shape[0] <= 16 and obs.device.type == "cpu"

    def draw_noise(self, batch_size):
        # Noisy nets: fresh noise for the online and the target net every gradient step. It
        # lives in the layers' buffers, which gradient workers receive with the synced tensors.
        if self.cfg.noisy:
            self.actor.reset_noise(self.rng["noisy"])
            self.target.reset_noise(self.rng["noisy"])
        return {}

    def target_update(self) -> None:
        self.polyak(self.target, self.actor, self.cfg.tau, self._pairs)

    def shared_targets(self, batch):
        # The target net only changes between updates (target_update runs in observe), so one
        # forward over every step's next_obs serves the whole update (noisy nets: the noise
        # is redrawn every gradient step, so each step computes its own).
        return None if self.cfg.noisy else self.over_distinct(self.target_q, batch)

    def target_q(self, obs):
        """The target net's Q-values, with observations normalized by the online normalizer's
        current statistics (the target's own copy is as old as the last target update)."""
        return self.target.q(obs, norm=self.actor.enc.norm)

    def phases(self, batch, noise, shared=None):
        """One gradient step; ``shared`` is ``shared_targets``' rows for this batch if already known."""
        cfg = self.cfg
        B = batch.obs.shape[0]
        if cfg.double:
            # one online forward over [obs; next_obs]: the second half only picks actions
            q_all = self.actor.q(torch.cat([batch.obs, batch.next_obs]))
            q_values, next_action = q_all[:B], q_all[B:].detach().argmax(-1, keepdim=True)
        else:
            q_values, next_action = self.actor.q(batch.obs), None
        with torch.no_grad():
            target = self.td_target(batch, shared, next_action)
        q = q_values.gather(-1, batch.action.long().unsqueeze(-1)).squeeze(-1)
        per_sample = F.smooth_l1_loss(q, target, reduction="none") if cfg.loss == "huber" else (q - target).square()
        # uniform replay's weights are all 1: skipping the product leaves the loss bit for bit the same
        loss = (per_sample * batch.weights).mean() if cfg.prioritized else per_sample.mean()
        yield self.optimizer, loss
        stats = {"q_loss": loss.detach(), "q_mean": q.detach().mean()}
        return stats, ((q.detach() - target).abs() if cfg.prioritized else None)

    def td_target(self, batch, next_q_target, next_action):
        """``r + discount * Q_target(s', a')``: ``a'`` the online net's choice (``next_action``,
        double) or the target's max; ``next_q_target`` is the target net's Q of ``next_obs``."""
        if next_q_target is None:
            next_q_target = self.target_q(batch.next_obs)
        if next_action is not None:
            next_q = next_q_target.gather(-1, next_action).squeeze(-1)
        else:
            next_q = next_q_target.amax(-1)
        return batch.reward + batch.discount * next_q

    def update(self, progress):
        out = super().update(progress)
        out["epsilon"] = self.epsilon
        return out

    # --- the fast path: ``corral.kernels.direct.huber_direct_step`` takes this step without autograd
    # where the net is one chain of linear layers, bit for bit ``phases`` (tests/test_kernels.py);
    # a subclass with its own ``phases`` runs that instead
    direct = Replaces(huber_direct_step, phases=phases)

    def direct_allowed(self) -> bool:
        """Whether the ``direct`` kernel computes this config's step: a plain Q-network, the Huber
        loss, no double or noisy nets."""
        cfg = self.cfg
        return isinstance(self.actor, QNetwork) and cfg.loss == "huber" and not (cfg.double or cfg.noisy)

    def train_step(self, batch, shared=None):
        chain = self._direct_chain()
        if chain is None:
            return super().train_step(batch, shared)
        stats, td = self.direct.fn(self, batch, shared, *chain)
        self.after_step(stats)
        return stats, td

    def _direct_chain(self):
        """The online net as one linear chain (``chain()``: ``(params, acts, activation)``) where the
        ``direct`` kernel is in force for this class, ``direct_allowed``, and one FlatAdam holds
        exactly its parameters; else None. Found once (the Parameter objects never change)."""
        if self._chain is None:
            use = self.direct.in_force(type(self)) and self.direct_allowed()
            self._chain = (direct_chain(self.actor, self.optimizer) if use else None) or False
        return self._chain or None
