"""Recurrent PPO (``ppo_lstm``): PPO whose actor-critic carries an LSTM or GRU state.

The recurrent state is part of the batch. Acting, each env column keeps its state and
resets it to zeros where an episode starts (``Algorithm.episodes_ended``); every step's
extras record carries the state that entered the step and the episode-start flag, so a
rollout (or a collector's fragment) holds what the policy saw. Training cuts each env
column into sequences of ``seq_len`` steps (the last one padded when ``seq_len`` does not
divide ``n_steps``) and re-runs the core over each from the state stored at its first step,
resetting at the episode starts inside it; padded steps are dropped before the loss, so
they count in no loss, gradient or statistic. Everything else (GAE, the clipped loss, the
epochs and minibatches, schedules, the epilogue) is PPO's own loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from corral.actors.recurrent import RecurrentActorCritic
from corral.algos.base import Step
from corral.algos.impala import IMPALA, IMPALAConfig
from corral.algos.onpolicy import OnPolicyConfig, PPOBatch, gae_batch, make_extractor
from corral.algos.ppo import PPO, PPOConfig, ppo_loss
from corral.algos.recurrent import RecurrentColumns
from corral.config import option
from corral.errors import UserError


@dataclass
class RecurrentCoreConfig(OnPolicyConfig):
    """The recurrent core's options, which ppo_lstm and impala_lstm share (each with its loop's)."""

    recurrent: Literal["lstm", "gru"] = option("lstm", "the recurrent core: lstm or gru")
    core_size: int = option(64, "units of the recurrent core", ge=1)
    core_layers: int = option(1, "stacked layers of the recurrent core", ge=1)
    shared_core: bool = option(True, "one core for the policy and value heads (false: the value head has its own)")
    seq_len: int | None = option(None, "steps per training sequence (None: the whole rollout column, n_steps)",
                                 ge=1)
    burn_in: int = option(0, "steps before each sequence re-run with the current network and no gradient to "
                             "refresh its stored start state (as far back as the rollout goes)", ge=0)
    hidden: tuple[int, ...] = option((64,), "hidden layer sizes of the policy and value heads after the core",
                                     ge=1)


@dataclass
class RecurrentPPOConfig(RecurrentCoreConfig, PPOConfig):
    """PPO's options with the recurrent core's."""


class RecurrentExtras(NamedTuple):
    """What recurrent PPO's ``explore`` hands to ``observe`` (and collectors ship) per step."""

    action: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    x: torch.Tensor  # the normalized observation
    state: torch.Tensor  # [N, state_dim]: the state entering this step (before the reset at a start)
    start: torch.Tensor  # [N] bool: this step's observation starts an episode


@dataclass
class RecurrentPPOBatch(PPOBatch):
    """PPO's flat batch plus its sequences: ``rows [L, S]`` index the flat ``[T*N]`` rows of
    sequence ``s`` (padding points at row 0), ``valid [L, S]`` marks real steps."""

    rows: torch.Tensor = None
    valid: torch.Tensor = None
    starts: torch.Tensor = None  # [L, S] episode starts (False on padding)
    state0: torch.Tensor = None  # [S, state_dim] the state entering each sequence's first step

    @property
    def sequences(self) -> int:
        return int(self.rows.shape[1])


class _Outputs:
    """A minibatch's outputs, computed over its sequences, presented to ``ppo_loss`` as an actor."""

    def __init__(self, head, logits: torch.Tensor, value: torch.Tensor):
        self.head, self.logits, self.value = head, logits, value

    def outputs(self, _x):
        return self.logits, self.value

    def evaluate_actions(self, _x, actions):
        params = self.head(self.logits)
        return self.head.log_prob(params, actions), self.head.entropy(params), self.value


def sequence_layout(T: int, N: int, L: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, valid)``, both ``[L, ceil(T / L) * N]``: sequence ``k * N + n`` is steps
    ``k L .. k L + L - 1`` of column ``n``; ``rows`` holds their flat ``t * N + n`` indices
    (0 where a step is past ``T``: padding), ``valid`` which steps are real."""
    K = -(-T // L)
    t = torch.arange(L).view(L, 1, 1) + L * torch.arange(K).view(1, K, 1)  # [L, K, 1]
    valid = (t < T).expand(L, K, N)
    rows = torch.where(valid, t * N + torch.arange(N).view(1, 1, N), 0)
    return rows.reshape(L, K * N).to(device), valid.reshape(L, K * N).to(device)


class RecurrentActorCriticParts(RecurrentColumns):
    """What the recurrent actor-critic algorithms share whatever their update (``ppo_lstm`` on
    PPO's loop, ``impala_lstm`` on IMPALA's): the actor, acting with the carried state, the
    states stored with the rollout, values read with the state, and its checkpointed state."""

    grad_sharding = None  # PPO's minibatch sharding does not cover a sequence update
    user_actor = False  # builds its own actor (make_actor)

    def __init__(self, cfg: RecurrentPPOConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        L = cfg.seq_len or cfg.n_steps
        if L > cfg.n_steps:
            raise UserError(f"{self.name}.seq_len={L} is longer than the rollout ({self.name}.n_steps="
                            f"{cfg.n_steps}); lower seq_len or leave it unset (the whole column)")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.seq_len = L
        self.init_columns()
        if self.stores:
            T = cfg.n_steps
            self.seq_states = torch.zeros(T, num_envs, self.actor.state_dim, device=device)
            self.seq_starts = torch.zeros(T, num_envs, dtype=torch.bool, device=device)
            self.rows, self.valid = sequence_layout(T, num_envs, L, device)

    def make_actor(self):
        cfg = self.cfg
        return RecurrentActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                    cfg.normalize_obs, cfg.log_std_init, cfg.recurrent, cfg.core_size,
                                    cfg.core_layers, cfg.shared_core, make_extractor(cfg.features, self.obs_space,
                                                                                     self.name), init=cfg.init)

    # --- hooks
    def scheme_config(self, collectors: int) -> dict:
        if collectors <= 1:
            return {}
        if self.cfg.burn_in:
            raise UserError(f"{self.name}.burn_in is not wired for collectors yet (a sequence's burn-in could reach "
                            "into another collector's fragment); set it to 0 with scheme.collectors > 1")
        if self.cfg.n_steps % self.seq_len:
            raise UserError(f"{self.name}.seq_len={self.seq_len} must divide {self.name}.n_steps={self.cfg.n_steps} "
                            "with collectors (a sequence must not run from one collector's fragment into the next)")
        return {**super().scheme_config(collectors), "seq_len": self.seq_len}

    # --- acting
    def act_recurrent(self, obs, state, starts, deterministic: bool = True):
        return self.actor.act(obs, state, starts, deterministic=deterministic, generator=self.rng["action"])

    def explore(self, obs):
        env_action, action, log_prob, value, x, state = self.actor.explore(obs, self._state, self._starts,
                                                                           self.rng["action"])
        return env_action, RecurrentExtras(action, log_prob, value, x, *self.step_columns(state))

    def observe(self, step: Step):
        t = self.storage.step
        self.seq_states[t].copy_(step.extras.state)
        self.seq_starts[t].copy_(step.extras.start)
        super().observe(step)

    # --- values with the state
    def bootstrap_value(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.actor.step_outputs(self.actor.normalize(obs), self._state, self._starts)[1]

    def truncation_values(self, data, c=slice(None)) -> torch.Tensor:
        """V(final_obs) where truncated (0 elsewhere), for the columns ``c``: the core's state
        after the step (one core step over the stored observation from the stored state) then
        one step over the final observation; two forwards over the truncated steps only."""
        where = data.truncated[:, c]
        out = torch.zeros(where.shape, device=self.device)
        if where.any():
            with torch.no_grad():
                states, starts = self.seq_states[:, c][where], self.seq_starts[:, c][where]
                _, _, after = self.actor.step_outputs(data.obs[:, c][where], states, starts)
                out[where] = self.actor.step_outputs(data.final_obs[:, c][where], after, None)[1]
        return out

    # --- state
    def extra_state(self):
        state = {**super().extra_state(), **self.columns_state()}
        if self.storage is not None and self.storage.step:
            state["seq"] = (self.seq_states[: self.storage.step].clone(), self.seq_starts[: self.storage.step].clone())
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.load_columns_state(state)
        if self.storage is not None and "seq" in state:
            n = state["seq"][0].shape[0]
            self.seq_states[:n], self.seq_starts[:n] = state["seq"]


class RecurrentPPO(RecurrentActorCriticParts, PPO):
    name = "ppo_lstm"
    Config = RecurrentPPOConfig

    # --- the update: PPO's loop over sequences
    def prepare_batch(self) -> RecurrentPPOBatch:
        data = self.storage.data
        data.final_values.copy_(self.truncation_values(data))
        b, adv, ret, whole = gae_batch(self.cfg, data, self.bootstrap_value(self._last_obs),
                                       self.whole_batch(data.rewards.numel()))
        rows, valid = self.rows, self.valid
        first = rows[0]  # each sequence's first flat row
        return RecurrentPPOBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret, whole, rows=rows, valid=valid,
                                 starts=self.seq_starts.flatten()[rows] & valid,
                                 state0=self.seq_states.flatten(0, 1)[first])

    def minibatch_plan(self, batch: RecurrentPPOBatch):
        """Per epoch, a fresh permutation of the sequences, ``batch_size // seq_len`` of them
        per minibatch (at least one); ``None`` is the whole batch."""
        per = max(1, self.cfg.batch_size // self.seq_len)
        for _ in range(self.cfg.n_epochs):
            if batch.whole:
                yield None
            else:
                yield from torch.randperm(batch.sequences, generator=self.rng["minibatch"],
                                          device=self.device).split(per)

    def minibatch_step(self, batch: RecurrentPPOBatch, idx, clip: float):
        loss, stats = self.sequence_loss(batch, idx, clip)
        return stats, self.applier(loss)

    def sequence_loss(self, batch: RecurrentPPOBatch, idx, clip: float):
        """``(loss, stats)`` of the sequences ``idx`` (None: all): the core re-run over each from
        its stored state, padding dropped, then PPO's loss over the real steps."""
        rows, valid = (batch.rows, batch.valid) if idx is None else (batch.rows[:, idx], batch.valid[:, idx])
        starts, state0 = (batch.starts, batch.state0) if idx is None else (batch.starts[:, idx], batch.state0[idx])
        if self.cfg.burn_in:
            state0 = self.burned_in(batch, rows[0], state0)
        logits, value, _ = self.actor.sequence_outputs(batch.obs[rows], state0, starts)
        keep = valid.flatten()
        flat = rows.flatten()[keep]
        outputs = _Outputs(self.actor.head, logits[keep], value[keep])
        loss, stats = ppo_loss(outputs, None, batch.actions[flat], batch.log_probs[flat], batch.values[flat],
                               batch.adv[flat], batch.ret[flat], clip, self.cfg,
                               self.cfg.normalize_advantage and not batch.whole)
        return loss, stats

    @torch.no_grad()
    def burned_in(self, batch: RecurrentPPOBatch, first: torch.Tensor, state0: torch.Tensor) -> torch.Tensor:
        """The state entering each sequence (first flat rows ``first``) re-computed with the
        current network over the ``burn_in`` steps before it (fewer where the rollout starts
        later), from the state stored at the first of them; no gradient flows through it."""
        N = self.num_envs
        t0, n = first // N, first % N
        back = t0.clamp(max=self.cfg.burn_in)
        out = state0.clone()
        for b in back.unique().tolist():  # sequences with as many burn-in steps go together
            if b == 0:
                continue
            sel = (back == b).nonzero().flatten()
            ts = (t0[sel] - b).unsqueeze(0) + torch.arange(b, device=self.device).unsqueeze(1)  # [b, s]
            rows = ts * N + n[sel]
            start_state = self.seq_states[t0[sel] - b, n[sel]]
            _, _, out[sel] = self.actor.sequence_outputs(batch.obs[rows], start_state,
                                                         self.seq_starts.flatten()[rows])
        return out


@dataclass
class RecurrentIMPALAConfig(IMPALAConfig, RecurrentCoreConfig):
    """IMPALA's options with the recurrent core's; ``seq_len`` (None: ``n_steps``) must divide
    ``n_steps``: each fragment is re-run in sequences from the states its collector stored."""


class RecurrentIMPALA(RecurrentActorCriticParts, IMPALA):
    """IMPALA (``impala_lstm``) on the recurrent actor-critic: V-trace over whole env columns
    as IMPALA's, the policy's outputs from the core re-run over each ``seq_len`` segment of
    each column from the state stored at its first step (the collector's, so the learner
    trains on what the collector saw)."""

    name = "impala_lstm"
    Config = RecurrentIMPALAConfig

    def __init__(self, cfg, obs_space, act_space, num_envs, device, rng, role="learner"):
        if cfg.n_steps % (cfg.seq_len or cfg.n_steps):
            raise UserError(f"{self.name}.seq_len={cfg.seq_len} must divide {self.name}.n_steps={cfg.n_steps}")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)

    def column_outputs(self, data, c):
        T, L = data.rewards.shape[0], self.seq_len
        obs = data.obs[:, c]
        n, K = obs.shape[1], T // L
        seq = lambda t: t.reshape(K, L, n, *t.shape[2:]).transpose(0, 1).reshape(L, K * n, *t.shape[2:])
        state0 = self.seq_states[::L, c].reshape(K * n, -1)
        logits, value, _ = self.actor.sequence_outputs(seq(obs), state0, seq(self.seq_starts[:, c]))
        back = lambda t: t.reshape(L, K, n, *t.shape[1:]).transpose(0, 1).reshape(T * n, *t.shape[1:])
        params = self.actor.head(back(logits))
        actions = data.actions[:, c].flatten(0, 1)
        log_prob, entropy = self.actor.head.log_prob(params, actions), self.actor.head.entropy(params)
        return log_prob.view(T, n), entropy.view(T, n), back(value).view(T, n)

    def column_bootstraps(self, data, last_obs, c):
        with torch.no_grad():
            last = self.actor.step_outputs(self.actor.normalize(last_obs[c]), self._state[c], self._starts[c])[1]
        return last, self.truncation_values(data, c)
