"""NGU (Badia et al. 2020a, "Never Give Up") and Agent57 (Badia et al. 2020b) on R2D2.

NGU is R2D2 (``corral.algos.r2d2``: sequence replay, stored state, burn-in, value
rescaling, n-step double Q) with:

* an **intrinsic reward** computed where the agent acts, for the observation ``x_t`` it
  acts from: ``r_i(x_t) = episodic(x_t) * clip(alpha(x_t), 1, L)``. ``episodic`` is the
  k-nearest-neighbour novelty of the controllable-state embedding ``f(x_t)`` against the
  episode's memory (``corral.exploration.episodic.EpisodicMemory``, reset at episode starts),
  ``f`` trained by inverse dynamics; ``alpha = 1 + (err - mean err) / std err`` is RND's
  life-long novelty (``corral.exploration.rnd.RND``), with running statistics of ``err``;
* a **family of N mixtures** ``(beta_j, gamma_j)`` (``corral.exploration.mixtures``): each
  env column acts with one ``j``; the Q-network is conditioned on it;
* the core's input per step: ``f_enc(x_t)``, one-hot ``a_{t-1}`` (zeros at an episode's
  start), ``r^e_{t-1}``, ``r_i(x_t)`` and one-hot ``j`` (stored per step as four ``aux``
  floats in the sequence replay);
* the **mixed reward** of step ``t``: ``r^e_t + beta_j r_i(x_{t+1})`` (0 intrinsic on the
  step that ends an episode: the final observation is never acted from) and ``gamma_j``
  in the n-step targets.

Agent57 (``Agent57`` below) keeps two networks, extrinsic and intrinsic, each trained by
its own TD loss on its own reward (``r^e``; ``r_i``), combined for acting as
``h(h^-1(Q_e) + beta_j h^-1(Q_i))``; each collector picks ``j`` per episode with a
sliding-window UCB bandit (``corral.exploration.bandit``) rewarded by the episode's
extrinsic return.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from corral.actors.recurrent import RecurrentQNetwork
from corral.algos.base import Policy, Step
from corral.algos.r2d2 import R2D2, R2D2Config, nstep_sequence_targets
from corral.config import option
from corral.errors import UserError
from corral.exploration.bandit import SlidingWindowUCB
from corral.exploration.episodic import EpisodicMemory, InverseDynamics
from corral.exploration.mixtures import column_mixtures, mixture_betas, mixture_gammas
from corral.exploration.rnd import RND
from corral.returns import value_unrescale

PREV_ACTION, PREV_EXT, INTRINSIC, MIXTURE = range(4)  # the aux floats stored per step


@dataclass
class NGUConfig(R2D2Config):
    num_mixtures: int = option(8, "N, the number of (beta_j, gamma_j) mixtures (the paper: 32)", ge=1)
    beta: float = option(0.3, "the largest intrinsic-reward weight, beta_{N-1}", ge=0)
    gamma_max: float = option(0.997, "gamma_0, the discount of the exploitative mixture j = 0", ge=0, lt=1)
    gamma_min: float = option(0.99, "gamma_{N-1}, the discount of the most exploratory mixture", ge=0, lt=1)
    eval_mixture: int = option(0, "the mixture j evaluation acts with (0: beta 0, gamma_max)", ge=0)
    embedding_dim: int = option(32, "width of the controllable-state embedding f", ge=1)
    embedding_hidden: int = option(128, "hidden units of the embedding MLP and the inverse-dynamics head", ge=1)
    embedding_lr: float = option(5e-4, "Adam learning rate of the embedding (inverse dynamics)", gt=0)
    episodic_capacity: int = option(5000, "episodic memory slots per env (a ring within an episode)", ge=1)
    knn: int = option(10, "k, the nearest neighbours the episodic novelty reads", ge=1)
    kernel_epsilon: float = option(1e-4, "epsilon of the kernel epsilon / (d^2 / d_m^2 + epsilon)", gt=0)
    cluster_distance: float = option(8e-3, "xi: normalised squared distances below it count as 0", ge=0)
    pseudo_count: float = option(1e-3, "c, the pseudo-count constant in 1 / (sqrt(sum K) + c)", gt=0)
    max_similarity: float = option(8.0, "s_m: a similarity above it gives no episodic reward", gt=0)
    lifelong: bool = option(True, "multiply by RND's life-long novelty, clipped to [1, lifelong_max]")
    lifelong_max: float = option(5.0, "L, the life-long multiplier's upper clip", ge=1)
    lifelong_ema: float = option(0.01, "weight of each acting step's RND errors in their running mean and variance "
                                       "(a plain mean until 1/lifelong_ema steps; then recent errors count more, "
                                       "as the predictor improves)", gt=0, le=1)
    rnd_hidden: tuple[int, ...] = option((64, 64), "RND's hidden layer sizes (flat observations)", ge=1)
    rnd_features: int = option(64, "RND's output width", ge=1)
    rnd_lr: float = option(5e-4, "Adam learning rate of RND's predictor", gt=0)
    train_mixture: Literal["actor", "random"] = option(
        "actor", "the mixture j each replayed sequence is trained for: actor (the paper: the one that collected it) "
                 "or random (drawn per sequence at the learner, uniform over the N: Q-learning is off-policy and "
                 "r_e + beta_j r_i is known for every j, so mixture 0 also learns from the exploratory mixtures' "
                 "sequences)")

    def sequence_dims(self) -> tuple[int, int]:
        return super().sequence_dims()[0], 4


class NGUAction(NamedTuple):
    action: torch.Tensor
    state: torch.Tensor  # [N, state_dim] entering the step
    start: torch.Tensor  # [N] bool
    aux: torch.Tensor  # [N, 4]: previous action (-1: none), previous extrinsic reward, r_i(x_t), mixture j


class NGU(R2D2):
    name = "ngu"
    Config = NGUConfig
    networks = ("actor", "target", "embedding", "rnd")
    optimizers = ("optimizer", "embed_optimizer", "rnd_optimizer")
    acting = ("actor", "embedding", "rnd")  # collectors compute the intrinsic reward

    def __init__(self, cfg: NGUConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if not isinstance(obs_space, gym.spaces.Box):
            raise UserError(f"{self.name} needs Box observations (vectors or images) for its embedding and RND, "
                            f"got {obs_space}")
        if cfg.eval_mixture >= cfg.num_mixtures:
            raise UserError(f"{self.name}.eval_mixture={cfg.eval_mixture} must be below num_mixtures="
                            f"{cfg.num_mixtures}")
        if cfg.knn > cfg.episodic_capacity:
            raise UserError(f"{self.name}.knn={cfg.knn} is larger than episodic_capacity={cfg.episodic_capacity}")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        N = cfg.num_mixtures
        self.betas = mixture_betas(N, cfg.beta).float().to(device)
        self.gammas = mixture_gammas(N, cfg.gamma_max, cfg.gamma_min).float().to(device)
        n_act = int(act_space.n)
        self.embedding = self._build(lambda: InverseDynamics(obs_space, n_act, cfg.embedding_dim,
                                                             cfg.embedding_hidden).to(device))
        self.rnd = self._build(lambda: RND(obs_space, tuple(cfg.rnd_hidden), cfg.rnd_features).to(device))
        self.embed_optimizer = self._optimizer(self.embedding.parameters(), cfg.embedding_lr)
        self.rnd_optimizer = self._optimizer(self.rnd.predictor.parameters(), cfg.rnd_lr)
        # acting state of each env column (checkpointed with the columns)
        self.memory = self.new_memory(num_envs)
        # running mean / var of RND's error and the acting steps folded in (exponential after 1/lifelong_ema)
        self.err_stats = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64, device=device)
        self._prev_action = torch.full((num_envs,), -1, dtype=torch.long, device=device)
        self._prev_ext = torch.zeros(num_envs, device=device)
        self._mix = column_mixtures(0, 1, num_envs, N, device)

    def new_memory(self, n: int) -> EpisodicMemory:
        c = self.cfg
        return EpisodicMemory(n, c.embedding_dim, c.episodic_capacity, c.knn, c.kernel_epsilon, c.cluster_distance,
                              c.pseudo_count, c.max_similarity, self.device)

    def make_q_network(self):
        cfg = self.cfg
        return RecurrentQNetwork(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.dueling,
                                 cfg.normalize_obs, cfg.recurrent, cfg.core_size, cfg.core_layers,
                                 cond_dim=int(self.act_space.n) + 2 + cfg.num_mixtures)

    def set_worker(self, index: int, count: int) -> None:
        super().set_worker(index, count)
        self._mix = column_mixtures(index, count, self.num_envs, self.cfg.num_mixtures, self.device)

    # --- the intrinsic reward and the core's inputs
    def intrinsic(self, obs: torch.Tensor, memory: EpisodicMemory, update: bool = True) -> torch.Tensor:
        """``r_i(x_t)`` for a batch of observations, one per column of ``memory`` (written to it);
        ``update``: fold RND's errors into the running statistics (acting, not evaluating)."""
        reward = memory.novelty(self.embedding(obs))
        if self.cfg.lifelong:
            err = self.rnd.novelty(obs).double()
            if update:
                self.fold_errors(err)
            mean, var, _ = self.err_stats
            alpha = 1.0 + (err - mean) / (var + 1e-8).sqrt()
            reward = reward * alpha.clamp(1.0, self.cfg.lifelong_max).float()
        return reward

    def fold_errors(self, err: torch.Tensor) -> None:
        """Move the running mean and variance of RND's error towards this step's errors, with
        weight ``max(lifelong_ema, 1 / steps)``: a plain mean at first, then exponential (the
        errors fall as the predictor learns; a mean over the whole run would keep the early
        large ones and leave every new error below it, every multiplier at 1)."""
        mean, var, steps = self.err_stats
        w = torch.clamp(1.0 / (steps + 1.0), min=self.cfg.lifelong_ema)
        b_mean, b_var = err.mean(), err.var(unbiased=False)
        delta = b_mean - mean
        new_mean = mean + w * delta
        new_var = (1 - w) * (var + w * delta.square()) + w * b_var
        self.err_stats = torch.stack([new_mean, torch.where(steps > 0, new_var, b_var), steps + 1.0])

    def conditioning(self, aux: torch.Tensor) -> torch.Tensor:
        """``aux [..., 4]`` -> the core's extra inputs ``[..., A + 2 + N]``."""
        prev = aux[..., PREV_ACTION].long()
        one_hot_a = F.one_hot(prev.clamp(min=0), self.n_actions).float() * (prev >= 0).unsqueeze(-1).float()
        one_hot_j = F.one_hot(aux[..., MIXTURE].long(), self.cfg.num_mixtures).float()
        return torch.cat([one_hot_a, aux[..., PREV_EXT:INTRINSIC + 1], one_hot_j], -1)

    def acting_q(self, q: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
        """The Q-values the policy is greedy on (Agent57 combines its two heads)."""
        return q

    def begin_episodes(self, starts: torch.Tensor) -> None:
        """Columns whose observation starts an episode: empty memory, no previous action or reward."""
        self.memory.reset(starts)
        self._prev_action = torch.where(starts, -1, self._prev_action)
        self._prev_ext = torch.where(starts, 0.0, self._prev_ext)

    def explore(self, obs):
        self.actor.enc.norm.update(obs)
        n = obs.shape[0]
        g = self.rng["noise"]
        random_action = torch.randint(self.n_actions, (n,), generator=g, device=self.device)
        explore_mask = torch.rand(n, generator=g, device=self.device) < self.epsilon
        self.begin_episodes(self._starts)
        r_i = self.intrinsic(obs, self.memory)
        aux = torch.stack([self._prev_action.float(), self._prev_ext, r_i, self._mix.float()], 1)
        q, state = self.actor.q_step(obs, self._state, self._starts, cond=self.conditioning(aux))
        action = torch.where(explore_mask, random_action, self.acting_q(q, self._mix).argmax(-1))
        self._prev_action = action
        return action, NGUAction(action, *self.step_columns(state), aux)

    def rewarded(self, reward: torch.Tensor) -> None:
        self._prev_ext = reward.to(self.device, torch.float32)

    def act_recurrent(self, obs, state, starts, deterministic: bool = True):
        """Greedy on mixture ``eval_mixture`` without a history: no previous action or reward and
        no episodic novelty (``policy()`` keeps them; use it where the episode is played through)."""
        n = obs.shape[0]
        aux = torch.zeros(n, 4, device=self.device)
        aux[:, PREV_ACTION] = -1
        aux[:, MIXTURE] = self.cfg.eval_mixture
        q, state = self.actor.q_step(obs, state, starts, cond=self.conditioning(aux))
        return self.acting_q(q, aux[:, MIXTURE].long()).argmax(-1), state

    def policy(self, deterministic: bool = True) -> Policy:
        return NGUPolicy(self)

    def export_policy(self):
        raise UserError(f"exporting {self.name} is not built: its policy reads an episodic memory and the previous "
                        "rewards as inputs")

    # --- storing and learning
    def store(self, step: Step) -> None:
        ex = step.extras
        seqs = self.window.add(obs=step.obs, action=ex.action, reward=step.reward, terminated=step.terminated,
                               truncated=step.truncated, start=ex.start, state=ex.state, aux=ex.aux)
        if seqs is not None:
            self.replay.add(seqs)

    def sequence_inputs(self, batch):
        return self.conditioning(batch.aux.transpose(0, 1))

    def next_intrinsic(self, batch) -> torch.Tensor:
        """``[B, S]``: ``r_i(x_{t+1})``, the intrinsic reward of step ``t`` (0 where the step ends
        an episode, and on the last step, which no trained step reads)."""
        ended = batch.terminated | batch.truncated
        out = torch.zeros_like(batch.reward)
        out[:, :-1] = batch.aux[:, 1:, INTRINSIC] * (~ended[:, :-1]).float()
        return out

    def mixed_targets(self, batch, reward, q_online_next, q_target):
        cfg = self.cfg
        bi, L = cfg.burn_in, cfg.seq_len
        gamma = self.gammas[batch.aux[:, bi:bi + L, MIXTURE].long()]  # [B, L]: the trained step's mixture
        return nstep_sequence_targets(reward, batch.terminated, batch.truncated, gamma, q_online_next, q_target,
                                      bi, L, cfg.n_step, cfg.double, cfg.rescale_eps if cfg.value_rescaling else None)

    def sequence_targets(self, batch, q_online_next, q_target):
        beta = self.betas[batch.aux[..., MIXTURE].long()]  # [B, S]
        return self.mixed_targets(batch, batch.reward + beta * self.next_intrinsic(batch), q_online_next, q_target)

    def relabel_mixtures(self, batch):
        """``batch`` with each sequence's mixture ``j`` drawn uniformly at the learner (the
        ``minibatch`` stream), for ``train_mixture=random``; the rest of the batch as it is."""
        j = torch.randint(self.cfg.num_mixtures, (batch.aux.shape[0], 1), generator=self.rng["minibatch"],
                          device=self.device)
        aux = batch.aux.clone()
        aux[..., MIXTURE] = j.float()
        return replace(batch, aux=aux)

    def train_step(self, batch, shared=None):
        if self.cfg.train_mixture == "random":
            batch = self.relabel_mixtures(batch)
        if self.cfg.lifelong:  # RND's observation statistics follow what the learner trains on
            self.rnd.update_obs_norm(batch.obs.flatten(0, 1))
        return super().train_step(batch, shared)

    def phases(self, batch, noise, shared=None):
        stats, priority = yield from super().phases(batch, noise, shared)
        ended = batch.terminated | batch.truncated
        obs = batch.obs
        inv_loss = self.embedding.loss(obs[:, :-1].flatten(0, 1), obs[:, 1:].flatten(0, 1),
                                       batch.action[:, :-1].flatten(), (~ended[:, :-1]).flatten())
        yield self.embed_optimizer, inv_loss
        stats["inverse_loss"] = inv_loss.detach()
        if self.cfg.lifelong:
            rnd_loss, _ = self.rnd.loss(obs.flatten(0, 1))
            yield self.rnd_optimizer, rnd_loss
            stats["rnd_loss"] = rnd_loss.detach()
        stats["intrinsic_mean"] = batch.aux[..., INTRINSIC].mean()
        return stats, priority

    # --- state
    def column_state(self) -> dict:
        m = self.memory
        return {**super().column_state(), "_prev_action": self._prev_action.clone(),
                "_prev_ext": self._prev_ext.clone(), "_mix": self._mix.clone(), "memory.memory": m.memory.clone(),
                "memory.size": m.size.clone(), "memory.dist_mean": m.dist_mean.clone(),
                "memory.dist_count": m.dist_count.clone()}

    def load_column_state(self, state: dict) -> None:
        for k, v in state.items():
            obj, name = (self.memory, k[7:]) if k.startswith("memory.") else (self, k)
            getattr(obj, name).copy_(v)

    def columns_state(self) -> dict:
        return {**super().columns_state(), "ngu_columns": self.column_state(),
                "ngu_err_stats": self.err_stats.clone()}

    def load_columns_state(self, state: dict) -> None:
        super().load_columns_state(state)
        self.load_column_state({k: v for k, v in state["ngu_columns"].items() if k not in ("_state", "_starts")})
        self.err_stats = state["ngu_err_stats"].to(self.device).clone()


class NGUPolicy(Policy):
    """What evaluation acts with: greedy on mixture ``eval_mixture`` with the same inputs the
    agent learned from (its previous action and reward, and the intrinsic reward from an
    episodic memory of its own per env copy; RND's statistics are read, not updated)."""

    def __init__(self, algo: NGU):
        self.algo = algo
        self.state = None

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        a, n = self.algo, obs.shape[0]
        if self.state is None or self.state.shape[0] != n:
            dev = a.device
            self.state = a.initial_state(n)
            self.starts = torch.ones(n, dtype=torch.bool, device=dev)
            self.memory = a.new_memory(n)
            self.prev_action = torch.full((n,), -1, dtype=torch.long, device=dev)
            self.prev_ext = torch.zeros(n, device=dev)
            self.mix = torch.full((n,), a.cfg.eval_mixture, dtype=torch.long, device=dev)
        with torch.no_grad():
            self.memory.reset(self.starts)
            self.prev_action = torch.where(self.starts, -1, self.prev_action)
            self.prev_ext = torch.where(self.starts, 0.0, self.prev_ext)
            r_i = a.intrinsic(obs, self.memory, update=False)
            aux = torch.stack([self.prev_action.float(), self.prev_ext, r_i, self.mix.float()], 1)
            q, self.state = a.actor.q_step(obs, self.state, self.starts, cond=a.conditioning(aux))
            action = a.acting_q(q, self.mix).argmax(-1)
        self.prev_action = action
        self.starts = torch.zeros_like(self.starts)
        return action

    def rewarded(self, reward: torch.Tensor) -> None:
        if self.state is not None:
            self.prev_ext = reward.to(self.algo.device, torch.float32).reshape(self.prev_ext.shape)

    def episodes_ended(self, ended: torch.Tensor) -> None:
        if self.state is not None:
            self.starts = ended.to(self.starts.device, torch.bool).reshape(self.starts.shape)


# ---------------------------------------------------------------------------
# Agent57


@dataclass
class Agent57Config(NGUConfig):
    bandit_window: int = option(160, "the meta-controller's sliding window, in episodes", ge=1)
    bandit_beta: float = option(1.0, "UCB bonus weight: mu(a) + beta sqrt(1 / n(a))", ge=0)
    bandit_epsilon: float = option(0.5, "the meta-controller picks a uniform arm with this probability", ge=0, le=1)

    def sequence_dims(self) -> tuple[int, int]:
        state, aux = super().sequence_dims()
        return 2 * state, aux  # two cores: extrinsic and intrinsic


class TwinRecurrentQ(nn.Module):
    """Agent57's two Q-networks, extrinsic and intrinsic, each with its own encoder, core and
    head; ``q_sequence`` returns both ``[2, T, B, A]`` and the two states side by side. Both
    read observations through the extrinsic network's normalizer."""

    def __init__(self, make):
        super().__init__()
        self.ext, self.intr = make(), make()

    @property
    def enc(self):
        return self.ext.enc

    @property
    def state_dim(self) -> int:
        return 2 * self.ext.state_dim

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        return torch.zeros(batch, self.state_dim, device=device)

    def q_sequence(self, obs, state, starts, norm=None, cond=None):
        d = self.ext.state_dim
        norm = self.ext.enc.norm if norm is None else norm
        qe, se = self.ext.q_sequence(obs, state[:, :d], starts, norm, cond)
        qi, si = self.intr.q_sequence(obs, state[:, d:], starts, norm, cond)
        return torch.stack([qe, qi]), torch.cat([se, si], 1)

    def q_step(self, obs, state, starts, norm=None, cond=None):
        q, state = self.q_sequence(obs.unsqueeze(0), state, None if starts is None else starts.unsqueeze(0), norm,
                                   None if cond is None else cond.unsqueeze(0))
        return q[:, 0], state


class Agent57(NGU):
    name = "agent57"
    Config = Agent57Config

    def __init__(self, cfg: Agent57Config, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.bandit = SlidingWindowUCB(cfg.num_mixtures, cfg.bandit_window, cfg.bandit_beta, cfg.bandit_epsilon,
                                       seed=self.rng.seeds["noise"] + 57, device=device)
        self._ep_return = torch.zeros(num_envs, device=device)

    def make_q_network(self):
        return TwinRecurrentQ(super().make_q_network)

    def set_worker(self, index: int, count: int) -> None:
        super().set_worker(index, count)
        self.bandit.generator.manual_seed(self.rng.seeds["noise"] + 57 + index)

    def acting_q(self, q, mix):
        beta = self.betas[mix].unsqueeze(-1)
        if self.cfg.value_rescaling:  # argmax of h(h^-1(Q_e) + beta h^-1(Q_i)) is that of its inside
            return value_unrescale(q[0], self.cfg.rescale_eps) + beta * value_unrescale(q[1], self.cfg.rescale_eps)
        return q[0] + beta * q[1]

    def begin_episodes(self, starts):
        super().begin_episodes(starts)
        count = int(starts.sum())
        if count:  # the meta-controller picks each new episode's mixture
            mix = self._mix.clone()
            mix[starts] = self.bandit.select(count)
            self._mix = mix

    def rewarded(self, reward):
        super().rewarded(reward)
        self._ep_return = self._ep_return + self._prev_ext

    def episodes_ended(self, ended):
        super().episodes_ended(ended)
        if bool(ended.any()):
            self.bandit.update(self._mix[ended], self._ep_return[ended])
            self._ep_return = torch.where(ended, 0.0, self._ep_return)

    def head_losses(self, batch, q_online, q_tgt):
        """Each network's TD loss on its own reward: ``(per-sequence loss e [B], i [B], |td| [B, L],
        mask [B, L], mean Q_e)``."""
        cfg = self.cfg
        bi, L, n = cfg.burn_in, cfg.seq_len, cfg.n_step
        action = batch.action[:, bi:bi + L].T.long().unsqueeze(-1)
        out = []
        for k, reward in enumerate((batch.reward, self.next_intrinsic(batch))):
            with torch.no_grad():
                target, trained = self.mixed_targets(batch, reward, q_online[k, n:n + L].detach(),
                                                     q_tgt[k, bi + n:bi + n + L])
            q = q_online[k, :L].gather(-1, action).squeeze(-1).T  # [B, L]
            td = q - target
            per_step = F.smooth_l1_loss(q, target, reduction="none") if cfg.loss == "huber" else 0.5 * td.square()
            mask = trained.float()
            out.append(((per_step * mask).sum(1) / mask.sum(1).clamp(min=1.0), td.detach().abs() * mask, mask, q))
        (le, td_e, mask, q_e), (li, td_i, _, _) = out
        q_mean = (q_e.detach() * mask).sum() / mask.sum().clamp(min=1.0)
        return le, li, torch.maximum(td_e, td_i), mask, q_mean

    def sequence_loss(self, batch, q_online, q_tgt):
        le, li, abs_td, mask, q_mean = self.head_losses(batch, q_online, q_tgt)
        return le + li, abs_td, mask, q_mean

    def columns_state(self) -> dict:
        return {**super().columns_state(), "bandit": self.bandit.state_dict(), "ep_return": self._ep_return.clone()}

    def load_columns_state(self, state: dict) -> None:
        super().load_columns_state(state)
        self.bandit.load_state_dict(state["bandit"])
        self._ep_return = state["ep_return"].to(self.device).clone()
