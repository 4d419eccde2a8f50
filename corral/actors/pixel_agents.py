"""The multi-agent actor-critic of pixel envs (:mod:`corral.envs.ma_pixels`): one Nature CNN
shared by every agent (parameter sharing, as the MLP actor shares its MLPs), a one-hot agent
id beside its features, linear (or ``hidden``) policy and value heads.

* ``ippo`` (``centralized_value=False``): the policy and the value read the same CNN features
  of the agent's own frames (one trunk, as corral's Atari PPO);
* ``mappo``: the value reads a second Nature CNN over the env's state frames (the whole
  screen), computed once per env step and shared by the step's agents.

**Rows are pointers.** Where :class:`~corral.actors.multiagent.MultiAgentActorCritic` stores
each (env, agent) column's inputs, this actor's rows are ``(frame, agent)`` (int64): ``frame``
indexes the rollout's packed uint8 steps (``frames [T * N, F]``, which MAPPO writes once per
step), so each agent's frames are stored once, and the state once per env step, however many
agents read it. Training reads rows through :class:`OnFrames`; acting reads packed
observations directly (``explore``, ``act``, ``packed_value``).
"""

from __future__ import annotations

import torch
from torch import nn

from corral.actors.actor_critic import ActionScaler
from corral.actors.multiagent import TeamActions, ValueNorm
from corral.envs.agent_layout import AgentLayout
from corral.nets import MLP, CategoricalHead, DiagGaussianHead, NatureCNN


class PixelAgentsActorCritic(TeamActions, nn.Module):
    """A CNN policy and value shared by all agents of a pixel env (see the module docstring)."""

    share_params = True

    def __init__(self, layout: AgentLayout, centralized_value: bool = True, agent_id: bool = True,
                 hidden: tuple[int, ...] = (), activation: str = "relu", log_std_init: float = 0.0,
                 value_norm: bool = True, value_norm_beta: float = 0.99999):
        super().__init__()
        if not layout.pixels:
            raise ValueError("PixelAgentsActorCritic needs a pixel layout (corral.envs.ma_pixels)")
        self.layout = L = layout
        A = L.n_agents
        self.centralized_value, self.agent_id = centralized_value, agent_id
        self.cnn = NatureCNN(L.frame)
        self.state_cnn = NatureCNN(L.state_frame) if centralized_value else None
        ids = A if agent_id else 0
        self.register_buffer("eye", torch.eye(A), persistent=False)
        self.register_buffer("agent_index", torch.arange(A), persistent=False)
        self.discrete = L.discrete
        if self.discrete:
            self.head, self.scaler = CategoricalHead(), None
        else:
            self.head = DiagGaussianHead(L.n_actions, log_std_init)
            self.scaler = ActionScaler(L.agent_action_space())
        self.pi = MLP(self.cnn.out_dim + ids, tuple(hidden), activation, out_dim=L.n_actions, out_gain=0.01)
        self.v = MLP(self.cnn.out_dim + ids, tuple(hidden), activation, out_dim=1, out_gain=1.0)
        self.value_norm = ValueNorm(value_norm_beta, enabled=value_norm)

    # --- what rollouts store
    def stored_obs(self) -> tuple[tuple[int, ...], torch.dtype]:
        return (2,), torch.long  # (frame, agent)

    def stored_action(self) -> tuple[tuple[int, ...], torch.dtype]:
        return ((), torch.long) if self.discrete else ((self.layout.n_actions,), torch.float32)

    def normalize(self, x: torch.Tensor, update: bool = False) -> torch.Tensor:
        return x

    @staticmethod
    def pointer_rows(step: int, num_envs: int, n_agents: int, device) -> torch.Tensor:
        """The rows of rollout step ``step``: ``(step * N + n, a)`` for env ``n``, agent ``a``, env-major."""
        n = torch.arange(num_envs, device=device).repeat_interleave(n_agents)
        a = torch.arange(n_agents, device=device).repeat(num_envs)
        return torch.stack([step * num_envs + n, a], dim=1)

    # --- the network
    def _heads(self, feats: torch.Tensor, sfeats: torch.Tensor, agent: torch.Tensor,
               amask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.agent_id:
            ids = self.eye[agent]
            feats, sfeats = torch.cat([feats, ids], 1), torch.cat([sfeats, ids], 1)
        logits = self.pi(feats)
        if amask is not None:  # invalid and padded actions: probability 0
            logits = logits.masked_fill(~amask, -1e8)
        return logits, self.v(sfeats).squeeze(-1)

    def packed_outputs(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed uint8 observations ``[N, F]`` -> (masked logits / means ``[N * A, K]``,
        normalized values ``[N * A]``), env-major; the state CNN once per env."""
        L = self.layout
        N, A = packed.shape[0], L.n_agents
        view = L.split(packed)
        feats = self.cnn(view.obs.reshape(N * A, *L.frame))
        sfeats = feats
        if self.state_cnn is not None:
            sfeats = self.state_cnn(view.state.reshape(N, *L.state_frame)).repeat_interleave(A, 0)
        amask = view.action_mask.reshape(N * A, -1) if self.discrete else None
        return self._heads(feats, sfeats, self.agent_index.repeat(N), amask)

    def row_outputs(self, rows: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pointer rows ``[B, 2]`` into ``frames [T * N, F]`` -> (masked logits / means, normalized
        values); each distinct state among the rows goes through the state CNN once."""
        L = self.layout
        A, D = L.n_agents, L.obs_dim
        f, a = rows[:, 0], rows[:, 1]
        feats = self.cnn(frames[:, :A * D].unflatten(1, (A, D))[f, a].reshape(-1, *L.frame))
        sfeats = feats
        if self.state_cnn is not None:
            uniq, inverse = torch.unique(f, return_inverse=True)
            sfeats = self.state_cnn(frames[uniq, L.state_start:L.mask_start].reshape(-1, *L.state_frame))[inverse]
        amask = None
        if self.discrete:
            amask = frames[:, L.action_mask_start:].unflatten(1, (A, L.n_actions))[f, a] > 0
        return self._heads(feats, sfeats, a, amask)

    def params(self, logits: torch.Tensor) -> torch.Tensor:
        return self.head(logits)

    # --- acting on packed observations
    def explore(self, packed: torch.Tensor, generator: torch.Generator | None = None):
        """(env actions ``[N, A(, K)]``, actions, log-probs, denormalized values, None): the rows
        to store are pointers the algorithm makes (``pointer_rows``)."""
        logits, value = self.packed_outputs(packed)
        params = self.head(logits)
        action = self.head.sample(params, generator)
        return (self.to_env(action, packed.shape[0]), action, self.head.log_prob(params, action),
                self.value_norm.denormalize(value), None)

    @torch.no_grad()
    def act(self, packed: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None):
        params = self.head(self.packed_outputs(packed)[0])
        action = self.head.mode(params) if deterministic else self.head.sample(params, generator)
        return self.to_env(action, packed.shape[0])

    def packed_value(self, packed: torch.Tensor) -> torch.Tensor:
        """Normalized values ``[N * A]`` of packed observations."""
        return self.packed_outputs(packed)[1]


class OnFrames:
    """The pixel actor as PPO's loss reads it (``head``, ``outputs``, ``evaluate_actions``), on
    pointer rows into one rollout's ``frames``."""

    def __init__(self, actor: PixelAgentsActorCritic, frames: torch.Tensor):
        self.actor, self.frames, self.head = actor, frames, actor.head

    def outputs(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor.row_outputs(rows, self.frames)

    def evaluate_actions(self, rows: torch.Tensor, action: torch.Tensor):
        logits, value = self.outputs(rows)
        params = self.head(logits)
        return self.head.log_prob(params, action), self.head.entropy(params), value


def cnn_sample_bytes(frame: tuple[int, ...]) -> int:
    """A Nature CNN's memory per sample in a training minibatch: the float input, each conv's
    output and its ReLU (kept for the backward), the features; twice over for the gradients."""
    c, s, _ = frame
    o1 = (s - 8) // 4 + 1
    o2 = (o1 - 4) // 2 + 1
    o3 = o2 - 2
    return 4 * (c * s * s + 2 * (32 * o1 * o1 + 64 * o2 * o2 + 64 * o3 * o3) + 2 * 512) * 2


def pixel_run_bytes(layout: AgentLayout, num_envs: int, n_steps: int, batch_size: int,
                    centralized_value: bool, discrete: bool) -> dict[str, int]:
    """What a pixel MAPPO / IPPO run allocates beyond the process it starts in, by part (bytes):
    ``frames`` (the rollout's packed uint8 steps), ``rollout`` (the per-agent pointer rows, actions,
    log-probs, values, rewards, flags and their flattened copies), ``minibatch`` (one minibatch's
    float frames and CNN activations, forward and backward), ``envs`` (the frame stacks and a
    step's packed rows)."""
    A, F = layout.n_agents, layout.size
    rows = n_steps * num_envs * A
    frames = n_steps * num_envs * F
    act = 8 if discrete else 4 * layout.n_actions
    rollout = rows * (2 * 16 + 2 * act + 6 * 4 + 3) * 2  # stored, then flattened and gathered once
    B = rows if batch_size <= 0 else min(batch_size, rows)
    minibatch = B * (cnn_sample_bytes(layout.frame) + layout.obs_dim)  # + the gathered uint8 frames
    if centralized_value:  # at most one state per agent step
        minibatch += B * (cnn_sample_bytes(layout.state_frame) + layout.state_dim)
    envs = num_envs * ((A * layout.obs_dim + layout.state_dim) * 2 + 4 * F)
    return {"frames": frames, "rollout": rollout, "minibatch": minibatch, "envs": envs}
