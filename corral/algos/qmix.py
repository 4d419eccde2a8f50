"""Value decomposition for cooperative teams: VDN (Sunehag et al. 2018) and QMIX (Rashid et
al. 2018), on the replay family's loop (``corral.algos.offpolicy``).

Each agent has a Q-network over its own observation (one network shared by all agents, a
one-hot agent id in its input; or, ``share_params=false``, one per agent, evaluated as one
batched network over agents); the team's value is a mix of the agents' chosen Q-values:

* ``vdn``: ``Q_tot = sum_a Q_a``;
* ``qmix``: ``Q_tot = w2(s)^T elu(W1(s)^T q + b1(s)) + V(s)``, the weights ``W1``, ``w2``
  produced by hypernetworks of the global state ``s`` and made non-negative (``abs``), so
  ``Q_tot`` is monotone in every ``Q_a`` and each agent's greedy action is the team's.

The replay holds team transitions of the packed multi-agent observation
(``corral.envs.multiagent``: per-agent observations, state, masks), the joint action, the
team reward and the env's episode flags, with n-step targets and PER from the replay family.
The TD target is ``r + gamma^n * Q_tot_target(s', argmax_a Q_a(o'_a))``: double Q (the online
agents pick, the target agents and target mixer score) or the target's own max. Absent
agents' Q-values enter the mixer as 0 (they contribute nothing), and only valid actions
(the action mask, padding included) are picked, by acting and by the target alike.
Transitions are sampled one at a time (transition replay), with feed-forward agents; or,
``recurrent=true`` (``RecurrentQMIX``), the paper's GRU agents trained on R2D2's sequence
replay (sequences stored with the agents' GRU state, reset at episode starts).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from corral.actors.multiagent import AgentMLP
from corral.algos.base import Action, Step
from corral.algos.dqn import linear_epsilon
from corral.algos.mappo import act_dict
from corral.algos.offpolicy import OffPolicy, OffPolicyConfig
from corral.algos.r2d2 import RecurrentAction, SequenceState, nstep_sequence_targets
from corral.algos.recurrent import RecurrentColumns
from corral.config import option
from corral.envs.multiagent import AgentLayout, agent_layout, require_layout
from corral.errors import UserError
from corral.nets import MLP, RecurrentCore, layer_init
from corral.storage.replay import ReplayCapacityError
from corral.storage.sequence import SequenceReplay, SequenceWindow


@dataclass
class QMIXConfig(OffPolicyConfig):
    mixer: Literal["qmix", "vdn"] = option("qmix", "qmix (monotonic hypernetwork mixer on the state) or vdn (sum)")
    mixing_embed_dim: int = option(32, "QMIX: width of the mixing network", ge=1)
    hypernet_hidden: int = option(64, "QMIX: hidden width of the hypernetworks (0: one linear layer each)", ge=0)
    double: bool = option(True, "double Q: the online agents pick the next actions, the target scores them")
    agent_id: bool = option(True, "a one-hot agent id in the shared agent network's input (with share_params "
                                   "only: per-agent weights need none)")
    share_params: bool = option(True, "one Q-network for all agents; false: each agent its own weights, evaluated "
                                      "as one batched network over agents")
    loss: Literal["mse", "huber"] = option("mse", "TD loss on Q_tot")
    exploration_fraction: float = option(0.1, "fraction of the run over which epsilon decays", ge=0, le=1)
    exploration_initial_eps: float = option(1.0, "epsilon at the start", ge=0, le=1)
    exploration_final_eps: float = option(0.05, "epsilon after the decay", ge=0, le=1)
    # pymarl's settings, in env steps: hard target copies, Adam at 5e-4, 64-unit agents
    buffer_size: int = option(100_000, "replay capacity in team transitions (all envs together)", ge=1)
    learning_starts: int = option(1000, "env steps collected before the first update", ge=0)
    batch_size: int = option(128, "team transitions per gradient step", ge=1)
    lr: float = option(5e-4, "Adam learning rate", gt=0)
    tau: float = option(1.0, "Polyak coefficient for the target networks (1.0: hard copy)", gt=0, le=1)
    target_update_interval: int = option(2000, "update the target networks every this many env steps", ge=1)
    hidden: tuple[int, ...] = option((64,), "hidden layer sizes of the agent Q-network", ge=1)
    max_grad_norm: float | None = option(10.0, "global gradient norm clip (None: off)", gt=0)
    # recurrent agents (the paper's GRU agents) on R2D2's sequence replay
    recurrent: bool = option(False, "GRU agents (hidden -> GRU -> Q, shared weights) trained on sequences from "
                                    "sequence replay, the state stored with each sequence")
    core_size: int = option(64, "recurrent: units of the agents' GRU", ge=1)
    seq_len: int = option(20, "recurrent: trained steps per sequence", ge=1)
    burn_in: int = option(0, "recurrent: steps before them that only warm up the GRU (no gradient)", ge=0)
    seq_period: int | None = option(None, "recurrent: steps between the starts of consecutive sequences of an env "
                                          "(None: seq_len)", ge=1)


def random_valid_action(action_mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random valid action per agent (the exponential race over the valid ones)."""
    e = torch.empty(action_mask.shape, device=action_mask.device).exponential_(generator=generator)
    return (-e.log_()).masked_fill(~action_mask, float("-inf")).argmax(-1)


class AgentQ(nn.Module):
    """The agents' Q-networks: ``q(packed) -> [B, A, K]`` (invalid actions -inf). One network
    for every agent (``share_params``, an agent id in its input), or one per agent held as
    one batched network over agents (``AgentMLP``)."""

    def __init__(self, layout: AgentLayout, hidden, activation: str, agent_id: bool, share_params: bool = True):
        super().__init__()
        A = layout.n_agents
        self.layout, self.agent_id, self.share_params = layout, agent_id and share_params, share_params
        self.register_buffer("eye", torch.eye(A), persistent=False)
        if share_params:
            self.net = MLP(layout.obs_dim + (A if self.agent_id else 0), tuple(hidden), activation,
                           out_dim=layout.n_actions)
        else:
            self.net = AgentMLP(A, layout.obs_dim, tuple(hidden), activation, layout.n_actions)

    def q(self, packed: torch.Tensor) -> torch.Tensor:
        view = self.layout.split(packed)
        x = view.obs
        if not self.share_params:
            return self.net.stacked(x).masked_fill(~view.action_mask, float("-inf"))
        if self.agent_id:
            B, A = x.shape[:2]
            x = torch.cat([x, self.eye.expand(B, A, A)], -1)
        return self.net(x).masked_fill(~view.action_mask, float("-inf"))

    @torch.no_grad()
    def act(self, packed: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        return self.q(packed).argmax(-1)


class VDNMixer(nn.Module):
    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return q.sum(-1)


class QMixer(nn.Module):
    """The monotonic mixer: weights from hypernetworks of the state, made non-negative with abs."""

    def __init__(self, n_agents: int, state_dim: int, embed: int = 32, hyper_hidden: int = 64):
        super().__init__()
        self.n_agents, self.embed = n_agents, embed

        def hyper(out: int) -> nn.Module:
            if hyper_hidden <= 0:
                return nn.Linear(state_dim, out)
            return nn.Sequential(nn.Linear(state_dim, hyper_hidden), nn.ReLU(), nn.Linear(hyper_hidden, out))

        self.hyper_w1 = hyper(n_agents * embed)
        self.hyper_w2 = hyper(embed)
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_v = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The non-negative mixing weights ``W1 [B, A, E]`` and ``w2 [B, E]`` for ``state``."""
        return (self.hyper_w1(state).abs().view(-1, self.n_agents, self.embed), self.hyper_w2(state).abs())

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.weights(state)
        hidden = F.elu(torch.bmm(q.unsqueeze(1), w1).squeeze(1) + self.hyper_b1(state))
        return (hidden * w2).sum(-1) + self.hyper_v(state).squeeze(-1)


class QMIX(OffPolicy):
    """QMIX; ``vdn`` is this class with ``mixer=vdn``."""

    name = "qmix"
    Config = QMIXConfig
    multi_agent = True
    value_method = True
    networks = ("actor", "mixer", "target", "target_mixer")
    optimizers = ("optimizer",)

    def __init__(self, cfg: QMIXConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        layout = require_layout(type(self).name, obs_space)
        if not layout.discrete:
            raise UserError(f"{type(self).name} needs Discrete actions; the env's agents have Box actions "
                            "(mpe envs: env.kwargs.continuous_actions=false)")
        if cfg.normalize_obs:
            raise UserError(f"{type(self).name}.normalize_obs is not built for multi-agent networks; leave it false")
        self.layout = layout
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.actor = self._build(lambda: self.make_agents().to(device))
        self.mixer = self._build(lambda: (VDNMixer() if cfg.mixer == "vdn" else QMixer(
            layout.n_agents, layout.state_dim, cfg.mixing_embed_dim, cfg.hypernet_hidden)).to(device))
        self.target = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_mixer = copy.deepcopy(self.mixer).requires_grad_(False)
        self.optimizer = self._optimizer(list(self.actor.parameters()) + list(self.mixer.parameters()), cfg.lr)

    def make_agents(self) -> nn.Module:
        cfg = self.cfg
        return AgentQ(self.layout, cfg.hidden, cfg.activation, cfg.agent_id, cfg.share_params)

    @property
    def epsilon(self) -> float:
        return linear_epsilon(self.cfg, self.env_steps, self.total_steps)

    # --- acting
    def explore(self, obs):
        view = self.layout.split(obs)
        g = self.rng["noise"]
        random_action = random_valid_action(view.action_mask, g)
        explore_mask = torch.rand(random_action.shape, generator=g, device=self.device) < self.epsilon
        action = random_action if bool(explore_mask.all()) else \
            torch.where(explore_mask, random_action, self.actor.q(obs).argmax(-1))
        return action, Action(action)

    def act(self, obs, deterministic: bool = True):
        return self.actor.act(obs)

    def act_dict(self, obs: dict, deterministic: bool = True) -> dict:
        """``{agent: observation}`` of one env -> ``{agent: action}`` (see ``corral.algos.mappo.act_dict``)."""
        return act_dict(self, obs, deterministic)

    # --- learning
    def chosen(self, q: torch.Tensor, action: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``Q_a(o_a, u_a)`` ``[B, A]``, 0 for absent agents (they add nothing to the mix)."""
        return q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1).masked_fill(~present, 0.0)

    def td_target(self, batch) -> torch.Tensor:
        nxt = self.layout.split(batch.next_obs)
        tq = self.target.q(batch.next_obs)
        if self.cfg.double:
            pick = self.actor.q(batch.next_obs).argmax(-1)
        else:
            pick = tq.argmax(-1)
        next_q = self.chosen(tq, pick, nxt.agent_mask)
        return batch.reward + batch.discount * self.target_mixer(next_q, nxt.state)

    def phases(self, batch, noise, shared=None):
        cfg = self.cfg
        view = self.layout.split(batch.obs)
        q = self.chosen(self.actor.q(batch.obs), batch.action, view.agent_mask)
        q_tot = self.mixer(q, view.state)
        with torch.no_grad():
            target = self.td_target(batch)
        err = q_tot - target
        per_sample = err.square() if cfg.loss == "mse" else F.smooth_l1_loss(q_tot, target, reduction="none")
        loss = (per_sample * batch.weights).mean() if cfg.prioritized else per_sample.mean()
        yield self.optimizer, loss
        stats = {"q_loss": loss.detach(), "q_tot_mean": q_tot.detach().mean(), "target_mean": target.mean()}
        return stats, (err.detach().abs() if cfg.prioritized else None)

    def target_update(self) -> None:
        self.polyak(self.target, self.actor, self.cfg.tau, self._pairs)
        if self.cfg.mixer == "qmix":  # VDN's sum has no parameters
            self.polyak(self.target_mixer, self.mixer, self.cfg.tau, self._pairs)

    def update(self, progress):
        out = super().update(progress)
        out["epsilon"] = self.epsilon
        return out


# ---------------------------------------------------------------------------
# Recurrent agents on sequence replay (``recurrent=true``)


class RecurrentAgentQ(nn.Module):
    """The paper's agent network, one for all agents: ``obs (+ agent id) -> MLP -> GRU -> Q``.
    The agents are folded into the GRU's batch; a batch's state is ``[B, A * core_size]``
    (each env column's agents side by side), reset to zeros where an episode starts
    (``RecurrentCore``'s ``starts``)."""

    def __init__(self, layout: AgentLayout, hidden, activation: str, agent_id: bool, core_size: int):
        super().__init__()
        A = layout.n_agents
        self.layout, self.agent_id = layout, agent_id
        self.register_buffer("eye", torch.eye(A), persistent=False)
        self.fc = MLP(layout.obs_dim + (A if agent_id else 0), tuple(hidden), activation)
        self.core = RecurrentCore(self.fc.out_dim, core_size, 1, "gru")
        self.out = layer_init(nn.Linear(core_size, layout.n_actions), 1.0)
        self.state_dim = A * self.core.state_dim

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        return torch.zeros(batch, self.state_dim, device=device)

    def q_sequence(self, packed: torch.Tensor, state: torch.Tensor, starts: torch.Tensor):
        """``packed [T, B, F]``, ``state [B, A * H]`` entering step 0, ``starts [T, B]`` ->
        ``(Q [T, B, A, K] with invalid actions -inf, state after step T - 1)``."""
        T, B = packed.shape[:2]
        A, H = self.layout.n_agents, self.core.hidden
        view = self.layout.split(packed.reshape(T * B, -1))
        x = view.obs
        if self.agent_id:
            x = torch.cat([x, self.eye.expand(T * B, A, A)], -1)
        h = self.fc(x).reshape(T, B * A, -1)
        out, state = self.core(h, state.reshape(B * A, H), starts.repeat_interleave(A, dim=1))
        q = self.out(out).reshape(T, B, A, -1)
        return q.masked_fill(~view.action_mask.reshape(T, B, A, -1), float("-inf")), state.reshape(B, A * H)

    def q_step(self, packed: torch.Tensor, state: torch.Tensor, starts: torch.Tensor):
        q, state = self.q_sequence(packed.unsqueeze(0), state, starts.unsqueeze(0))
        return q[0], state

    @torch.no_grad()
    def act(self, packed: torch.Tensor, state: torch.Tensor, starts: torch.Tensor):
        q, state = self.q_step(packed, state, starts)
        return q.argmax(-1), state


class RecurrentQMIX(SequenceState, RecurrentColumns, QMIX):
    """QMIX / VDN with GRU agents, on R2D2's sequence replay (``corral.storage.sequence``).

    Each env column is cut into sequences of ``burn_in + seq_len + n_step`` steps stored with
    the agents' GRU state entering their first step and the joint action as one index
    (``sum_j u_j K^j``). A gradient step unrolls the online agents over the burn-in without
    gradient and over the rest with it, the target agents over the whole sequence, both from
    the stored state (reset at episode starts inside the sequence); mixes the chosen Q-values
    per step on that step's state; and takes R2D2's n-step targets
    (``corral.algos.r2d2.nstep_sequence_targets``) with the target mixer's ``Q_tot`` of the
    double-Q picks as the bootstrap (cut at terminations, steps whose window meets a
    truncation left out)."""

    replay_by_name = False  # its own sequence replay (_make_replay)

    def __init__(self, cfg: QMIXConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if not cfg.share_params:
            raise UserError(f"{type(self).name}.recurrent builds one GRU agent network shared by all agents; "
                            "leave share_params true")
        self.sequence = cfg.burn_in + cfg.seq_len + cfg.n_step
        self.period = cfg.seq_period or cfg.seq_len
        if self.period > self.sequence:
            raise UserError(f"{type(self).name}.seq_period={self.period} is longer than a sequence ({self.sequence} "
                            "steps: burn_in + seq_len + n_step)")
        layout = agent_layout(obs_space)
        self.base_k = layout.n_actions if layout is not None else 1
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        if self.base_k ** self.layout.n_agents >= 2 ** 62:
            raise UserError(f"{self.name}.recurrent stores the joint action as one index; "
                            f"{self.base_k}^{self.layout.n_agents} joint actions do not fit")
        self.init_columns()
        self.window = None
        if self.stores:
            self.window = SequenceWindow(self.sequence, self.period, num_envs, (self.layout.size,), torch.float32,
                                         torch.long, self.actor.state_dim, device)

    def make_agents(self) -> nn.Module:
        cfg = self.cfg
        return RecurrentAgentQ(self.layout, cfg.hidden, cfg.activation, cfg.agent_id, cfg.core_size)

    def _make_replay(self):
        cfg = self.cfg
        capacity = max(cfg.batch_size, cfg.buffer_size // self.period)
        try:
            return SequenceReplay(capacity, self.sequence, (self.layout.size,), torch.float32, torch.long,
                                  self.layout.n_agents * cfg.core_size, self.device, self.rng.seeds["replay"],
                                  cfg.prioritized, cfg.per_alpha, cfg.per_beta, cfg.per_beta_final, cfg.per_eps)
        except ReplayCapacityError as e:
            raise UserError(str(e)) from None

    # --- joint actions as one index
    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """``[..., A]`` per-agent actions -> ``[...]`` joint index ``sum_j u_j K^j``."""
        powers = self.base_k ** torch.arange(self.layout.n_agents, device=action.device)
        return (action.long() * powers).sum(-1)

    def decode(self, joint: torch.Tensor) -> torch.Tensor:
        powers = self.base_k ** torch.arange(self.layout.n_agents, device=joint.device)
        return (joint.long().unsqueeze(-1) // powers) % self.base_k

    # --- acting
    def explore(self, obs):
        view = self.layout.split(obs)
        g = self.rng["noise"]
        random_action = random_valid_action(view.action_mask, g)
        explore_mask = torch.rand(random_action.shape, generator=g, device=self.device) < self.epsilon
        q, state = self.actor.q_step(obs, self._state, self._starts)  # always: the state moves on
        action = torch.where(explore_mask, random_action, q.argmax(-1))
        return action, RecurrentAction(action, *self.step_columns(state))

    def act_recurrent(self, obs, state, starts, deterministic: bool = True):
        return self.actor.act(obs, state, starts)

    def store(self, step: Step) -> None:
        ex = step.extras
        seqs = self.window.add(obs=step.obs, action=self.encode(ex.action), reward=step.reward,
                               terminated=step.terminated, truncated=step.truncated, start=ex.start, state=ex.state)
        if seqs is not None:
            self.replay.add(seqs)

    # --- learning
    def initial_priorities(self, fragment):
        return None

    def _groups(self, steps: int):
        for _ in range(steps):
            self.replay.beta_steps = max(1, self.total_steps // max(1, self.num_envs * self.cfg.train_freq))
            yield self.replay.sample(self.cfg.batch_size)

    def mixed(self, mixer, q: torch.Tensor, action: torch.Tensor, view) -> torch.Tensor:
        """``Q_tot [T, B]`` of the chosen ``action [T, B, A]`` from agents' ``q [T, B, A, K]``."""
        T, B, A = action.shape
        chosen = self.chosen(q, action, view.agent_mask.reshape(T, B, A))
        return mixer(chosen.reshape(T * B, A), view.state.reshape(T * B, -1)).reshape(T, B)

    def phases(self, batch, noise, shared=None):
        cfg = self.cfg
        bi, L, n = cfg.burn_in, cfg.seq_len, cfg.n_step
        obs, starts = batch.obs.transpose(0, 1), batch.start.T  # [S, B, ...]
        S, B = starts.shape
        view = self.layout.split(obs.reshape(S * B, -1))

        def step_view(sl):  # the view of steps ``sl`` of every sequence, flat [len * B, ...]
            return type(view)(*(None if v is None else v.reshape(S, B, *v.shape[1:])[sl].flatten(0, 1)
                                for v in view))

        actions = self.decode(batch.action.T)  # [S, B, A]
        state0 = batch.state
        with torch.no_grad():
            state = state0
            if bi:
                _, state = self.actor.q_sequence(obs[:bi], state0, starts[:bi])
            q_tgt, _ = self.target.q_sequence(obs, state0, starts)
        q_online, _ = self.actor.q_sequence(obs[bi:], state, starts[bi:])  # [L + n, B, A, K]
        q_tot = self.mixed(self.mixer, q_online[:L], actions[bi:bi + L], step_view(slice(bi, bi + L))).T  # [B, L]
        with torch.no_grad():
            nxt = slice(bi + n, bi + n + L)
            pick = (q_online[n:n + L] if cfg.double else q_tgt[nxt]).argmax(-1)
            boot = self.mixed(self.target_mixer, q_tgt[nxt], pick, step_view(nxt))  # [L, B]
            target, trained = nstep_sequence_targets(batch.reward, batch.terminated, batch.truncated, cfg.gamma,
                                                     torch.zeros_like(boot).unsqueeze(-1), boot.unsqueeze(-1),
                                                     bi, L, n, True, None)
        td = q_tot - target
        per_step = td.square() if cfg.loss == "mse" else F.smooth_l1_loss(q_tot, target, reduction="none")
        mask = trained.float()
        per_seq = (per_step * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        loss = (per_seq * batch.weights).mean() if cfg.prioritized else per_seq.mean()
        yield self.optimizer, loss
        abs_td = td.detach().abs() * mask
        stats = {"q_loss": loss.detach(), "q_tot_mean": (q_tot.detach() * mask).sum() / mask.sum().clamp(min=1.0),
                 "target_mean": (target * mask).sum() / mask.sum().clamp(min=1.0)}
        return stats, (abs_td.amax(1) if cfg.prioritized else None)


def qmix_variant(cfg: QMIXConfig) -> type[QMIX]:
    """The registry's pick for ``qmix`` / ``vdn``: ``recurrent=true`` builds :class:`RecurrentQMIX`
    (the same algorithm name, GRU agents on sequence replay)."""
    return RecurrentQMIX if cfg.recurrent else QMIX
