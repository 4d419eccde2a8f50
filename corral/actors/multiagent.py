"""Multi-agent actors: the agent dimension folded into the batch.

A packed multi-agent observation ``[N, F]`` (``corral.envs.multiagent``) becomes ``N * A``
rows, one per (env, agent) column, env-major (row ``n * A + a``). A row holds what one
agent's policy and value see: ``[policy input | value input | action mask]``, the policy
input the agent's own observation (plus a one-hot agent id when parameters are shared), the
value input the global state (MAPPO's centralised value; plus the agent id) or the agent's
own observation (IPPO). Rollouts store these rows, so PPO's loss, minibatching and
checkpoints run on them unchanged.

Per-agent parameters (``share_params=False``): every agent has its own policy and value
weights, held as one ``ParallelMLP`` over agents (``AgentMLP``): rows then end with the
agent's index instead of carrying a one-hot id, and a batch of rows in any order (PPO's
shuffled minibatches) is scattered into ``[A, M, in]`` by agent, evaluated in one batched
pass and gathered back, so agent i's rows reach only agent i's slice of the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from corral.actors.actor_critic import ActionScaler
from corral.envs.multiagent import AgentLayout
from corral.nets import MLP, CategoricalHead, DiagGaussianHead, ParallelMLP


class AgentMLP(nn.Module):
    """``A`` MLPs of one shape, one per agent, evaluated as one ``ParallelMLP``.

    ``forward(x, agent)``: rows ``x [B, in]`` in any order with their agents ``agent [B]``
    (long); each row goes through its own agent's MLP only. The rows are scattered into
    ``[A, M, in]`` (``M`` the largest count of one agent's rows; the unused slots are zero
    and their outputs dropped), one batched pass, gathered back: about the cost of one MLP
    over the ``B`` rows, not ``A`` times it. ``stacked(x [N, A, in]) -> [N, A, out]``: rows
    already grouped by env, every agent present (the acting path), no scatter."""

    def __init__(self, n_agents: int, in_dim: int, hidden: tuple[int, ...], act: str, out_dim: int,
                 out_gain: float = 1.0):
        super().__init__()
        self.n_agents = n_agents
        self.net = ParallelMLP(n_agents, in_dim, tuple(hidden), act, out_dim=out_dim,
                               out_gains=(out_gain,) * n_agents)
        self.out_dim = out_dim

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.transpose(0, 1)).transpose(0, 1)

    def forward(self, x: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        A = self.n_agents
        onehot = torch.nn.functional.one_hot(agent, A)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1  # the row's rank among its agent's rows
        m = int(onehot.sum(0).max()) if x.shape[0] else 0
        grouped = x.new_zeros(A, m, x.shape[1])
        grouped[agent, slot] = x
        return self.net(grouped)[agent, slot]


class ValueNorm(nn.Module):
    """Running mean and variance of value targets with debiased exponential averages (the
    MAPPO code's ``ValueNorm``, Yu et al. 2022): the value net predicts normalized values,
    its loss is on normalized returns, and GAE reads values denormalized. ``enabled=False``
    is the identity."""

    def __init__(self, beta: float = 0.99999, eps: float = 1e-5, enabled: bool = True):
        super().__init__()
        self.beta, self.eps, self.enabled = beta, eps, enabled
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.debiasing_term.clamp(min=self.eps)
        mean = self.running_mean / d
        var = (self.running_mean_sq / d - mean.square()).clamp(min=1e-2)
        return mean, var

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if not self.enabled or x.numel() == 0:
            return
        x = x.double()
        b = self.beta
        self.running_mean.mul_(b).add_(x.mean() * (1 - b))
        self.running_mean_sq.mul_(b).add_(x.square().mean() * (1 - b))
        self.debiasing_term.mul_(b).add_(1 - b)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        mean, var = self.stats()
        return ((x - mean) / var.sqrt()).to(x.dtype)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        mean, var = self.stats()
        return (x * var.sqrt() + mean).to(x.dtype)


class TeamActions:
    """``to_env``, shared by the multi-agent actors (flat rows here, frames in ``pixel_agents.py``):
    the actions of ``n`` envs' agents, one per row, as the env takes them, ``[n, A]`` (discrete) or
    ``[n, A, K]`` scaled to the agents' bounds. The actor sets ``layout``, ``discrete``, ``scaler``."""

    layout: AgentLayout
    discrete: bool
    scaler: ActionScaler | None

    def to_env(self, action: torch.Tensor, n: int) -> torch.Tensor:
        A = self.layout.n_agents
        if self.discrete:
            return action.reshape(n, A)
        return self.scaler(action).reshape(n, A, -1)


class MultiAgentActorCritic(TeamActions, nn.Module):
    """One policy and one value MLP shared by all agents (agent id in their inputs), on the
    rows ``columns`` builds. Discrete actions: a categorical head whose logits are masked by
    the agent's action mask (padding included); Box actions: a diagonal Gaussian in unit
    space, scaled to the agents' (common) bounds."""

    def __init__(self, layout: AgentLayout, centralized_value: bool = True, agent_id: bool = True,
                 hidden: tuple[int, ...] = (64, 64), activation: str = "tanh", log_std_init: float = 0.0,
                 value_norm: bool = True, value_norm_beta: float = 0.99999, share_params: bool = True):
        super().__init__()
        self.layout = layout
        A = layout.n_agents
        self.share_params = share_params
        agent_id = agent_id and share_params  # per-agent weights know their agent
        self.centralized_value, self.agent_id = centralized_value, agent_id
        ids = A if agent_id else 0
        self.pi_dim = layout.obs_dim + ids
        self.v_dim = (layout.state_dim if centralized_value else layout.obs_dim) + ids
        self.mask_dim = layout.n_actions if layout.discrete else 0
        self.register_buffer("eye", torch.eye(A), persistent=False)
        self.register_buffer("agent_index", torch.arange(A), persistent=False)
        space = layout.agent_action_space()
        self.discrete = layout.discrete
        if self.discrete:
            self.head = CategoricalHead()
            self.scaler = None
        else:
            self.head = DiagGaussianHead(layout.n_actions, log_std_init)
            self.scaler = ActionScaler(space)
        if share_params:
            self.pi = MLP(self.pi_dim, tuple(hidden), activation, out_dim=layout.n_actions, out_gain=0.01)
            self.v = MLP(self.v_dim, tuple(hidden), activation, out_dim=1, out_gain=1.0)
        else:
            self.pi = AgentMLP(A, self.pi_dim, tuple(hidden), activation, layout.n_actions, out_gain=0.01)
            self.v = AgentMLP(A, self.v_dim, tuple(hidden), activation, 1, out_gain=1.0)
            if not self.discrete:  # a log-std per agent: the head's parameter is [A, K], read by row
                self.head.log_std = nn.Parameter(torch.full((A, layout.n_actions), float(log_std_init)))
        self.value_norm = ValueNorm(value_norm_beta, enabled=value_norm)

    # --- rows
    def row_dim(self) -> int:
        return self.pi_dim + self.v_dim + self.mask_dim + (0 if self.share_params else 1)

    def columns(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed observations ``[N, F]`` -> (rows ``[N * A, row_dim]``, agent present ``[N * A]``)."""
        L = self.layout
        view = L.split(packed)
        N, A = packed.shape[0], L.n_agents
        parts = [view.obs]
        ids = self.eye.expand(N, A, A) if self.agent_id else None
        if ids is not None:
            parts.append(ids)
        parts.append(view.state.unsqueeze(1).expand(N, A, L.state_dim) if self.centralized_value else view.obs)
        if ids is not None:
            parts.append(ids)
        if self.discrete:
            parts.append(view.action_mask.to(packed.dtype))
        if not self.share_params:  # the agent's index, last (which weights the row goes through)
            parts.append(self.agent_index.to(packed.dtype).expand(N, A).unsqueeze(-1))
        return torch.cat(parts, dim=-1).reshape(N * A, -1), view.agent_mask.reshape(N * A)

    def stored_obs(self) -> tuple[tuple[int, ...], torch.dtype]:
        return (self.row_dim(),), torch.float32

    def stored_action(self) -> tuple[tuple[int, ...], torch.dtype]:
        return ((), torch.long) if self.discrete else ((self.layout.n_actions,), torch.float32)

    def normalize(self, x: torch.Tensor, update: bool = False) -> torch.Tensor:
        return x  # rows are stored as built

    # --- what PPO's loss calls
    def _policy(self, x: torch.Tensor, stacked: int = 0) -> torch.Tensor:
        """Masked logits (or Gaussian means) of rows ``x``; ``stacked=N``: ``x`` is ``N`` envs'
        full env-major columns (the acting path), so per-agent weights need no scatter."""
        p, v = self.pi_dim, self.pi_dim + self.v_dim
        if self.share_params:
            logits = self.pi(x[:, :p])
        elif stacked:
            logits = self.pi.stacked(x[:, :p].reshape(stacked, self.layout.n_agents, p)).reshape(x.shape[0], -1)
        else:
            logits = self.pi(x[:, :p], self.row_agent(x))
        if self.discrete:
            # invalid and padded actions: probability 0
            logits = logits.masked_fill(x[:, v:v + self.mask_dim] < 0.5, -1e8)
        return logits

    def row_agent(self, x: torch.Tensor) -> torch.Tensor:
        """Each row's agent index (per-agent parameters: the rows' last column)."""
        return x[:, -1].long()

    def _params(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.discrete or self.share_params:
            return self.head(logits)
        return torch.cat([logits, self.head.log_std[self.row_agent(x)]], dim=-1)

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw policy output (masked logits / mean) and the (normalized) value of rows ``x``."""
        return self._policy(x), self.value(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, value = self.outputs(x)
        return self._params(x, logits), value

    def value(self, x: torch.Tensor, stacked: int = 0) -> torch.Tensor:
        p, v = self.pi_dim, self.pi_dim + self.v_dim
        if self.share_params:
            return self.v(x[:, p:v]).squeeze(-1)
        if stacked:
            return self.v.stacked(x[:, p:v].reshape(stacked, self.layout.n_agents, v - p)).reshape(-1)
        return self.v(x[:, p:v], self.row_agent(x)).squeeze(-1)

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor):
        params, value = self.forward(x)
        return self.head.log_prob(params, action), self.head.entropy(params), value

    # --- acting
    def explore(self, packed: torch.Tensor, generator: torch.Generator | None = None):
        """(env actions ``[N, A(, K)]``, actions, log-probs, denormalized values, rows), rows ``[N * A]``."""
        x, _ = self.columns(packed)
        n = packed.shape[0]
        params, value = self._params(x, self._policy(x, stacked=n)), self.value(x, stacked=n)
        action = self.head.sample(params, generator)
        return (self.to_env(action, packed.shape[0]), action, self.head.log_prob(params, action),
                self.value_norm.denormalize(value), x)

    @torch.no_grad()
    def act(self, packed: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None):
        x, _ = self.columns(packed)
        params = self._params(x, self._policy(x, stacked=packed.shape[0]))
        action = self.head.mode(params) if deterministic else self.head.sample(params, generator)
        return self.to_env(action, packed.shape[0])
