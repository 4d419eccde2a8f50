"""The recurrent actor-critic: ``ActorCritic``'s encoder (MLP input, Nature CNN, one-hot,
Dict / Tuple parts), then an LSTM or GRU core (``corral.nets.RecurrentCore``), then the
policy and value heads. The recurrent state is one ``[B, state_dim]`` tensor per batch of
env columns; the caller keeps it and says where episodes start (``starts``)."""

from __future__ import annotations

import torch
from torch import nn

from corral.actors.actor_critic import ActorCritic
from corral.nets import ParallelMLP, RecurrentCore


class RecurrentActorCritic(ActorCritic):
    """``explore``/``act`` take ``(obs, state, starts)`` and return the new state too;
    ``sequence_outputs`` re-runs stored sequences (training).

    ``shared_core``: one core feeds both heads (the value loss trains it too); otherwise the
    value head has its own core (sb3-contrib's ``enable_critic_lstm``), and the state is the
    two cores' states side by side."""

    def __init__(self, obs_space, act_space, hidden=(64,), activation="tanh", normalize_obs=True,
                 log_std_init=0.0, core: str = "lstm", core_size: int = 64, core_layers: int = 1,
                 shared_core: bool = True, extractor: nn.Module | None = None, init: str = "orthogonal"):
        self._core_args = (core, int(core_size), int(core_layers), bool(shared_core))
        super().__init__(obs_space, act_space, hidden, activation, normalize_obs, log_std_init, extractor=extractor,
                         init=init)

    def make_body(self, in_dim, hidden, activation, pi_out) -> nn.Module:
        kind, size, layers, shared = self._core_args
        self.core = RecurrentCore(in_dim, size, layers, kind)
        self.value_core = None if shared else RecurrentCore(in_dim, size, layers, kind)
        return ParallelMLP(2, size, hidden, activation, out_dim=pi_out, out_gains=(0.01, 1.0), init=self.init)

    @property
    def state_dim(self) -> int:
        return self.core.state_dim * (1 if self.value_core is None else 2)

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        return torch.zeros(batch, self.state_dim, device=device)

    def run_core(self, f: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None):
        """Features ``[T, B, F]`` -> (what the heads take: ``[T*B, H]``, or ``[2, T*B, H]`` with a
        value core; the state after the last step)."""
        if self.value_core is None:
            h, state = self.core(f, state, starts)
            return h.flatten(0, 1), state
        d = self.core.state_dim
        hp, sp = self.core(f, state[:, :d], starts)
        hv, sv = self.value_core(f, state[:, d:], starts)
        return torch.stack([hp.flatten(0, 1), hv.flatten(0, 1)]), torch.cat([sp, sv], 1)

    # --- sequences of stored (normalized) observations
    def sequence_outputs(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None):
        """``x [T, B, ...]`` from ``state [B, D]`` with episode starts ``[T, B]`` ->
        ``(logits [T*B, ...], value [T*B], state after the last step)``, rows in ``[T, B]`` order."""
        T, B = x.shape[:2]
        flat = x.flatten(0, 1)
        h, state = self.run_core(self.features(flat).view(T, B, -1), state, starts)
        logits, value = self.heads(flat, h)
        return logits, value, state

    def step_outputs(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None):
        """One step: ``x [B, ...]`` -> ``(logits, value, new state)``."""
        h, state = self.run_core(self.features(x).unsqueeze(0), state, None if starts is None else starts.unsqueeze(0))
        logits, value = self.heads(x, h)
        return logits, value, state

    def outputs(self, x):
        raise TypeError("a recurrent actor's outputs depend on its state: use step_outputs or sequence_outputs")

    # --- acting
    def explore(self, obs, state, starts, generator=None):
        """Sample for training: ``(env_action, action, log_prob, value, normalized obs, new state)``."""
        x = self.normalize(obs, update=True)
        logits, value, state = self.step_outputs(x, state, starts)
        params = self.head(logits)
        action = self.head.sample(params, generator)
        return self.to_env(action), action, self.head.log_prob(params, action), value, x, state

    @torch.no_grad()
    def act(self, obs, state, starts=None, deterministic: bool = True, generator=None):
        """``(env actions, new state)`` for a batch of raw observations; never updates the normalizer."""
        x = self.normalize(obs)
        logits, _, state = self.step_outputs(x, state, starts)
        params = self.head(logits)
        action = self.head.mode(params) if deterministic else self.head.sample(params, generator)
        return self.to_env(action), state


class RecurrentQNetwork(nn.Module):
    """Q(history, .) for Discrete actions (DRQN, R2D2): the off-policy observation encoder
    (normalizer, Nature CNN, one-hot, Dict parts), an LSTM or GRU core, then a Q head on the
    core's output (``dueling``: V + A - mean A, as ``QNetwork``). ``cond_dim``: the core also
    takes that many per-step inputs beside the observation's features (NGU's ``cond``)."""

    def __init__(self, obs_space, act_space, hidden=(64,), activation="relu", dueling: bool = False,
                 normalize_obs: bool = False, core: str = "lstm", core_size: int = 64, core_layers: int = 1,
                 cond_dim: int = 0):
        super().__init__()
        import gymnasium as gym

        from corral.actors.offpolicy import ObsEncoder, QNetwork

        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.core = RecurrentCore(self.enc.dim + int(cond_dim), core_size, core_layers, core)
        # the Q head reads the core's output as its (unnormalized) input
        self.head = QNetwork(gym.spaces.Box(-1.0, 1.0, (core_size,)), act_space, tuple(hidden), activation, dueling,
                             normalize_obs=False)
        self.n = int(act_space.n)

    @property
    def state_dim(self) -> int:
        return self.core.state_dim

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        return self.core.initial_state(batch, device)

    def q_sequence(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None, norm=None,
                   cond: torch.Tensor | None = None):
        """``obs [T, B, ...]`` raw -> ``(Q [T, B, actions], state after the last step)``;
        ``norm`` replaces the encoder's normalizer (a target net takes the online one's);
        ``cond [T, B, cond_dim]``: the per-step inputs beside the observation."""
        T, B = obs.shape[:2]
        f = self.enc(obs.flatten(0, 1), norm).view(T, B, -1)
        if cond is not None:
            f = torch.cat([f, cond.to(f.dtype)], -1)
        h, state = self.core(f, state, starts)
        return self.head(h.flatten(0, 1)).view(T, B, -1), state

    def q_step(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None, norm=None,
               cond: torch.Tensor | None = None):
        q, state = self.q_sequence(obs.unsqueeze(0), state, None if starts is None else starts.unsqueeze(0), norm,
                                   None if cond is None else cond.unsqueeze(0))
        return q[0], state

    @torch.no_grad()
    def act(self, obs, state, starts=None, deterministic: bool = True, generator=None):
        q, state = self.q_step(obs, state, starts)
        return q.argmax(-1), state
