"""R2D2 (Kapturowski et al. 2019) and DRQN (Hausknecht & Stone 2015): recurrent Q-learning
from sequence replay, one implementation with flags (DRQN is a preset, as ``d3qn`` is).

Each env column is cut into overlapping sequences of ``burn_in + seq_len + n_step`` steps
(``corral.storage.sequence``), stored with the recurrent state that entered their first
step. A gradient step, for a batch of sequences:

1. unrolls the online core over the first ``burn_in`` steps from the stored state with no
   gradient (R2D2's burn-in: it refreshes a stale stored state), then over the rest with
   gradient; the target net unrolls the whole sequence from the same stored state;
   (``stored_state=False``: both start from zeros, DRQN's bootstrapped random updates);
2. for the ``seq_len`` trained steps, the n-step double-Q target
   ``h(sum_i gamma^i r_{t+i} + gamma^n h^-1(Q_target(s_{t+n}, argmax_a Q(s_{t+n}, a))))``, with
   ``h`` the value rescaling (``value_rescaling``), cut at a termination (no bootstrap);
   a step whose n-step window meets a time-limit truncation is left out of the loss (its
   bootstrap would need the final observation, which a sequence does not hold);
3. the loss is the mean over the trained steps of each sequence, weighted by the
   importance weights, and the sequence's new priority is ``eta max_t |td| + (1 - eta)
   mean_t |td|``.

Acting is epsilon-greedy on the recurrent Q, with DQN's schedule in one process; with
``scheme.collectors > 1`` it runs as Ape-X does (``corral.algos.apex``): each env of each
collector gets its epsilon from the ladder ``eps_base ** (1 + eps_alpha * i / (G - 1))``, the
collectors' fragments go to a replay server that cuts them into sequences
(``SequenceReplayServer``: one window per collector, so a sequence never mixes two
collectors' columns), and the learner samples from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F

from corral.actors.recurrent import RecurrentQNetwork
from corral.algos.apex import ApexMixin
from corral.algos.base import Step
from corral.algos.dqn import DQN, DQNConfig, linear_epsilon
from corral.algos.recurrent import RecurrentColumns
from corral.config import option
from corral.errors import UserError
from corral.returns import value_rescale, value_unrescale
from corral.storage.replay import ReplayCapacityError, _obs_spec
from corral.storage.sequence import SequenceReplay, SequenceWindow


@dataclass
class R2D2Config(DQNConfig):
    recurrent: Literal["lstm", "gru"] = option("lstm", "the recurrent core: lstm or gru")
    core_size: int = option(128, "units of the recurrent core", ge=1)
    core_layers: int = option(1, "stacked layers of the recurrent core", ge=1)
    hidden: tuple[int, ...] = option((128,), "hidden layer sizes of the Q head after the core", ge=1)
    seq_len: int = option(40, "trained steps per sequence", ge=1)
    burn_in: int = option(40, "steps before them that only warm up the core (no gradient)", ge=0)
    seq_period: int | None = option(None, "steps between the starts of consecutive sequences of a column "
                                          "(None: seq_len, so every step is trained in one sequence)", ge=1)
    stored_state: bool = option(True, "start each sequence from the state stored at collection (false: zeros, DRQN)")
    value_rescaling: bool = option(True, "targets h(r + gamma^n h^-1(Q)), h(x) = sign(x)(sqrt(|x|+1)-1) + eps x")
    rescale_eps: float = option(1e-3, "the eps of the value rescaling h", gt=0)
    priority_eta: float = option(0.9, "sequence priority eta * max|td| + (1 - eta) * mean|td|", ge=0, le=1)
    # R2D2's values where DQN's differ
    double: bool = option(True, "Double DQN targets: the online net picks the next action, the target net scores it")
    dueling: bool = option(True, "dueling head: Q = V + A - mean(A)")
    loss: Literal["huber", "mse"] = option("mse", "TD loss: mse (R2D2) or huber")
    n_step: int = option(5, "n-step returns (cut at termination)", ge=1)
    gamma: float = option(0.997, "discount factor", ge=0, le=1)
    prioritized: bool = option(True, "prioritized sequence replay")
    per_alpha: float = option(0.9, "prioritization exponent alpha", ge=0)
    per_beta: float = option(0.6, "importance-sampling exponent beta", ge=0, le=1)
    per_beta_final: float = option(0.6, "beta at the end of the run, reached linearly", ge=0, le=1)
    batch_size: int = option(32, "sequences per gradient step", ge=1)
    buffer_size: int = option(1_000_000, "replay capacity in steps (it holds buffer_size / seq_period sequences)",
                              ge=1)
    # distributed (scheme.collectors > 1), as Ape-X
    rollout_fragment: int = option(64, "env steps per env in a fragment sent to the replay server", ge=1)
    prefetch: int = option(4, "batches the learner draws from the replay server per request", ge=1)
    eps_base: float = option(0.4, "collectors' epsilon ladder: eps_i = eps_base ** (1 + eps_alpha * i / (envs - 1))",
                             ge=0, le=1)
    eps_alpha: float = option(7.0, "epsilon ladder exponent range", ge=0)
    # noisy nets are refused here (not wired for recurrent Q-networks), so their scale is no
    # option (a ClassVar is not a dataclass field: the key is refused as unknown)
    noisy_sigma0: ClassVar[None] = None

    def sequence_dims(self) -> tuple[int, int]:
        """``(recurrent state width, per-step aux floats)`` a stored sequence holds (the replay
        server reads them here; NGU stores 4 aux floats per step, Agent57 two cores' states)."""
        return self.core_size * self.core_layers * (2 if self.recurrent == "lstm" else 1), 0


def nstep_sequence_targets(reward, terminated, truncated, gamma, q_online_next, q_target, burn_in: int,
                           seq_len: int, n_step: int, double: bool = True, rescale_eps: float | None = 1e-3):
    """R2D2's n-step double-Q targets over sequences: ``(targets [B, L], trained mask [B, L])``
    for the ``seq_len`` steps after ``burn_in``. ``reward`` / flags ``[B, S]``; ``gamma`` a float,
    or ``[B, L]`` per trained step (NGU's per-mixture discounts); ``q_online_next`` /
    ``q_target`` ``[L, B, A]`` at steps ``burn_in + n .. burn_in + n + L``; ``rescale_eps``
    None: no value rescaling."""
    bi, L, n = burn_in, seq_len, n_step
    B = reward.shape[0]
    ret = torch.zeros(B, L, device=reward.device)
    alive = torch.ones(B, L, dtype=torch.bool, device=reward.device)
    left_out = torch.zeros(B, L, dtype=torch.bool, device=reward.device)
    discount = 1.0
    for i in range(n):
        window = slice(bi + i, bi + i + L)
        ret = ret + discount * reward[:, window] * alive
        term, trunc = terminated[:, window], truncated[:, window]
        left_out |= alive & trunc & ~term
        alive = alive & ~(term | trunc)
        discount = discount * gamma
    if double:
        next_q = q_target.gather(-1, q_online_next.argmax(-1, keepdim=True)).squeeze(-1)
    else:
        next_q = q_target.amax(-1)
    next_q = next_q.T  # [B, L]
    if rescale_eps is not None:
        next_q = value_unrescale(next_q, rescale_eps)
    target = ret + discount * alive * next_q
    if rescale_eps is not None:
        target = value_rescale(target, rescale_eps)
    return target, ~left_out


DRQN_OVERRIDES = {"stored_state": False, "burn_in": 0, "value_rescaling": False, "prioritized": False,
                  "n_step": 1, "double": False, "dueling": False, "loss": "huber", "gamma": 0.99, "seq_len": 10,
                  "core_size": 64, "hidden": (64,)}


class RecurrentAction(NamedTuple):
    """What a recurrent value method's ``explore`` hands to ``observe`` per step."""

    action: torch.Tensor
    state: torch.Tensor  # [N, state_dim] entering the step
    start: torch.Tensor  # [N] bool: this step's observation starts an episode


class SequenceState:
    """Checkpoint state of a recurrent replay algorithm (R2D2, recurrent QMIX): the columns'
    recurrent state and the sequence window of unfinished sequences, beside the base's."""

    def extra_state(self):
        state = {**super().extra_state(), **self.columns_state()}
        if self.window is not None:
            state["window"] = self.window.state_dict()
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.load_columns_state(state)
        if self.window is not None and "window" in state:
            self.window.load_state_dict(state["window"])


class R2D2(SequenceState, RecurrentColumns, ApexMixin, DQN):
    name = "r2d2"
    Config = R2D2Config
    replay_items = "sequences"  # with collectors, a SequenceReplayServer cuts their fragments
    replay_by_name = False  # its own sequence replay (_make_replay)

    def __init__(self, cfg: R2D2Config, obs_space, act_space, num_envs, device, rng, role="learner"):
        if cfg.noisy:
            raise UserError(f"{self.name}.noisy is not wired for recurrent Q-networks; leave it false")
        self.sequence = cfg.burn_in + cfg.seq_len + cfg.n_step
        self.period = cfg.seq_period or cfg.seq_len
        if self.period > self.sequence:
            raise UserError(f"{self.name}.seq_period={self.period} is longer than a sequence ({self.sequence} steps: "
                            "burn_in + seq_len + n_step); steps between sequences would never be stored")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.init_columns()
        self.window = None
        if self.stores:
            obs_shape, obs_dtype = _obs_spec(obs_space)
            self.window = SequenceWindow(self.sequence, self.period, num_envs, obs_shape, obs_dtype, torch.long,
                                         self.actor.state_dim, device, cfg.sequence_dims()[1])

    def make_q_network(self):
        cfg = self.cfg
        return RecurrentQNetwork(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.dueling,
                                 cfg.normalize_obs, cfg.recurrent, cfg.core_size, cfg.core_layers)

    def _make_replay(self):
        cfg = self.cfg
        obs_shape, obs_dtype = _obs_spec(self.obs_space)
        capacity = max(cfg.batch_size, cfg.buffer_size // (cfg.seq_period or cfg.seq_len))
        try:
            return SequenceReplay(capacity, cfg.burn_in + cfg.seq_len + cfg.n_step, obs_shape, obs_dtype, torch.long,
                                  self._state_dim(), self.device, self.rng.seeds["replay"], cfg.prioritized,
                                  cfg.per_alpha, cfg.per_beta, cfg.per_beta_final, cfg.per_eps,
                                  cfg.sequence_dims()[1])
        except ReplayCapacityError as e:
            raise UserError(str(e)) from None

    def _state_dim(self) -> int:
        cfg = self.cfg
        return cfg.sequence_dims()[0]

    # --- acting
    @property
    def epsilon(self):
        if self.workers > 1:  # a collector of a distributed run: its envs' rungs of the ladder
            c = self.cfg
            return self.env_ladder(c.eps_base, c.eps_base ** (1.0 + c.eps_alpha))
        return linear_epsilon(self.cfg, self.env_steps, self.total_steps)  # (noisy is refused for R2D2)

    def act_recurrent(self, obs, state, starts, deterministic: bool = True):
        return self.actor.act(obs, state, starts)

    def explore(self, obs):
        self.actor.enc.norm.update(obs)  # where observations are seen (collectors report what they saw)
        n = obs.shape[0]
        g = self.rng["noise"]
        random_action = torch.randint(self.n_actions, (n,), generator=g, device=self.device)
        explore_mask = torch.rand(n, generator=g, device=self.device) < self.epsilon
        q, state = self.actor.q_step(obs, self._state, self._starts)  # always: the state moves on
        action = torch.where(explore_mask, random_action, q.argmax(-1))
        return action, RecurrentAction(action, *self.step_columns(state))

    def greedy(self, obs):
        raise TypeError(f"{self.name} acts from a state: use act_recurrent")

    def store(self, step: Step) -> None:
        ex = step.extras
        seqs = self.window.add(obs=step.obs, action=ex.action, reward=step.reward, terminated=step.terminated,
                               truncated=step.truncated, start=ex.start, state=ex.state)
        if seqs is not None:
            self.replay.add(seqs)

    # --- learning
    def initial_priorities(self, fragment):
        return None  # sequences are cut on the server: they enter at the largest priority

    def shared_targets(self, batch):
        return None

    def _groups(self, steps: int):
        replay = self.replay
        for _ in range(steps):
            replay.beta_steps = max(1, self.total_steps // max(1, self.num_envs * self.cfg.train_freq))
            yield replay.sample(self.cfg.batch_size)

    def sequence_targets(self, batch, q_online_next: torch.Tensor, q_target: torch.Tensor):
        """``(targets [B, L], trained mask [B, L])`` for the ``seq_len`` trained steps; ``q_online_next``
        ``[n + L... ]``: the online Q (detached) at steps ``burn_in + n .. burn_in + n + L``, ``q_target``
        the target net's Q at the same steps, both ``[L, B, A]``."""
        cfg = self.cfg
        return nstep_sequence_targets(batch.reward, batch.terminated, batch.truncated, cfg.gamma, q_online_next,
                                      q_target, cfg.burn_in, cfg.seq_len, cfg.n_step, cfg.double,
                                      cfg.rescale_eps if cfg.value_rescaling else None)

    def sequence_inputs(self, batch):
        """``[S, B, C]`` per-step inputs the core takes besides the observation (NGU's), or None."""
        return None

    def sequence_q(self, batch):
        """``(online Q [L + n, B, A] after the burn-in, with gradient; target Q [S, B, A])``."""
        cfg = self.cfg
        bi = cfg.burn_in
        obs, starts = batch.obs.transpose(0, 1), batch.start.T  # [S, B, ...]
        cond = self.sequence_inputs(batch)
        part = (lambda t: None) if cond is None else (lambda t: cond[t])  # noqa: E731
        state0 = batch.state if cfg.stored_state else torch.zeros_like(batch.state)
        with torch.no_grad():
            state = state0
            if bi:
                _, state = self.actor.q_sequence(obs[:bi], state0, starts[:bi], cond=part(slice(None, bi)))
            q_tgt, _ = self.target.q_sequence(obs, state0, starts, norm=self.actor.enc.norm, cond=cond)
        q_online, _ = self.actor.q_sequence(obs[bi:], state, starts[bi:], cond=part(slice(bi, None)))
        return q_online, q_tgt

    def phases(self, batch, noise, shared=None):
        cfg = self.cfg
        q_online, q_tgt = self.sequence_q(batch)
        per_seq, abs_td, mask, q_mean = self.sequence_loss(batch, q_online, q_tgt)
        loss = (per_seq * batch.weights).mean() if cfg.prioritized else per_seq.mean()
        yield self.optimizer, loss
        counts = mask.sum(1)
        priority = (cfg.priority_eta * abs_td.amax(1)
                    + (1 - cfg.priority_eta) * abs_td.sum(1) / counts.clamp(min=1.0))
        stats = {"q_loss": loss.detach(), "q_mean": q_mean}
        return stats, (priority if cfg.prioritized else None)

    def sequence_loss(self, batch, q_online, q_tgt):
        """``(loss per sequence [B], |td| masked [B, L], trained mask [B, L] float, mean Q)`` from
        the online Q ``[L + n, B, A]`` (steps after burn-in) and the target Q ``[S, B, A]``."""
        cfg = self.cfg
        bi, L, n = cfg.burn_in, cfg.seq_len, cfg.n_step
        with torch.no_grad():
            target, trained = self.sequence_targets(batch, q_online[n:n + L].detach(), q_tgt[bi + n:bi + n + L])
        q = q_online[:L].gather(-1, batch.action[:, bi:bi + L].T.long().unsqueeze(-1)).squeeze(-1).T  # [B, L]
        td = q - target
        per_step = F.smooth_l1_loss(q, target, reduction="none") if cfg.loss == "huber" else 0.5 * td.square()
        mask = trained.float()
        per_seq = (per_step * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        q_mean = (q.detach() * mask).sum() / mask.sum().clamp(min=1.0)
        return per_seq, td.detach().abs() * mask, mask, q_mean


