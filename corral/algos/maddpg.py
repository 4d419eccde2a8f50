"""MADDPG (Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive
Environments") and MATD3 (Ackermann et al. 2019, "Reducing Overestimation Bias in Multi-Agent
Domains Using Double Centralized Critics"), on the replay family's loop
(``corral.algos.offpolicy``) with TD3's options (``corral.algos.td3``).

Decentralised actors, centralised critics. Each agent acts on its own observation: one actor
shared by all agents with a one-hot agent id in its input (``shared_actor``), or one actor
per agent (a batched ensemble). The critic scores the team's joint action on the global state
(the env's ``state()``, else the agents' observations concatenated) or on all agents'
observations (``critic_input``): ``Q(x, a_1, ..., a_A)``. ``rewards=team`` (cooperative games):
the replay holds the team reward (``corral.envs.multiagent``: the mean of the acting agents'
rewards), and one centralised critic (or MATD3's twin) serves every agent. ``rewards=agent``
(competitive and mixed games, the paper's setting): the replay holds each agent's reward
``[A]``, the critic has one head per agent, ``Q_i(x, a_1, ..., a_A)``, trained on agent ``i``'s
return, and agent ``i``'s actor ascends its own ``Q_i``.

* critic: ``y = r + gamma^n * min_k Q'_k(x', mu'_1(o'_1), ..., mu'_A(o'_A))``, the min over
  ``n_critics`` (MADDPG 1, MATD3 2); MATD3 adds clipped Gaussian smoothing to the target
  actions (``target_noise``) and updates the actors and targets every ``policy_delay`` critic
  updates;
* actor (the paper's gradient, eq. 5): for every agent ``i``, ``-Q(x, a_1, .., mu_i(o_i), .., a_A)``
  with the other agents' actions from the replay, averaged over the agents present, plus
  ``action_reg`` times the squared pre-activations (the MADDPG code's 1e-3 on the logits);
* discrete actions: the actor's logits (masked by the action mask) give a straight-through
  Gumbel-softmax sample (forward: the one-hot of ``argmax(logits + g)``; backward: the
  gradient of ``softmax((logits + g) / temperature)``), as in the paper; acting samples the
  same distribution (Gumbel-max), evaluation takes the argmax. The target action is the
  target actor's argmax (MADDPG), or a Gumbel-max sample of it with MATD3's smoothing on;
* continuous actions: ``tanh`` outputs in unit space, scaled to each agent's bounds, with
  Gaussian exploration noise (``exploration_noise``), uniform random actions before
  ``learning_starts`` (as TD3).

**Absent agents** (``agent_mask`` 0) are masked out of every loss: their actions enter the
critic as zeros (in ``x`` and in ``x'``), their observations do not enter
``critic_input=observations``, and their terms are left out of the actor loss and its penalty.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from corral.actors.offpolicy import Critics
from corral.algos.base import Action
from corral.algos.mappo import act_dict
from corral.algos.offpolicy import OffPolicy
from corral.algos.td3 import DelayedActor, TD3Config
from corral.config import option
from corral.envs.multiagent import AgentLayout, AgentView, require_layout
from corral.errors import UserError
from corral.nets import MLP, ParallelMLP


@dataclass
class MADDPGConfig(TD3Config):
    # MADDPG: one critic, no delay, no smoothing; MATD3 (MATD3_OVERRIDES) sets TD3's values
    n_critics: int = option(1, "centralised critics; targets use the min over them (MATD3: 2)", ge=1)
    policy_delay: int = option(1, "actor and target updates every this many critic updates (MATD3: 2)", ge=1)
    target_noise: float = option(0.0, "std of the smoothing noise on continuous target actions, unit scale "
                                      "(MATD3: 0.2); discrete actions: > 0 samples the target action (Gumbel-max)",
                                 ge=0)
    gumbel_temperature: float = option(1.0, "temperature of the straight-through Gumbel-softmax (discrete actions)",
                                       gt=0)
    shared_actor: bool = option(True, "one actor for all agents (with agent_id); false: one actor per agent")
    agent_id: bool = option(True, "a one-hot agent id in the shared actor's input")
    critic_input: Literal["state", "observations"] = option(
        "state", "what the centralised critic sees besides the joint action: the global state, or all agents' "
                 "observations (absent agents' zeroed)")
    rewards: Literal["team", "agent"] = option(
        "team", "what the critic learns: the team reward (cooperative games), or each agent's own reward with a "
                "critic head per agent (competitive and mixed games, the paper's setting)")
    action_reg: float = option(1e-3, "weight of the squared pre-activations (logits, pre-tanh) in the actor loss",
                               ge=0)
    # the MADDPG paper's settings (appendix): two 64-unit layers, gamma 0.95, tau 0.01, batch 1024, clip 0.5
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the actor and critic", ge=1)
    gamma: float = option(0.95, "discount factor", ge=0, le=1)
    tau: float = option(0.01, "Polyak coefficient for the target networks", gt=0, le=1)
    lr: float = option(1e-3, "critic Adam learning rate (and the actor's unless actor_lr)", gt=0)
    batch_size: int = option(1024, "team transitions per gradient step", ge=1)
    learning_starts: int = option(1000, "env steps collected (random actions) before the first update", ge=0)
    max_grad_norm: float | None = option(0.5, "global gradient norm clip (None: off)", gt=0)
    # TD3's Ornstein-Uhlenbeck option is not in MADDPG's acting (Gaussian noise only): taken out of
    # the options (a ClassVar is not a dataclass field: the key is refused as unknown)
    exploration_noise_type: ClassVar[None] = None


MATD3_OVERRIDES = {"n_critics": 2, "policy_delay": 2, "target_noise": 0.2}


def gumbel_softmax(logits: torch.Tensor, gumbel: torch.Tensor, temperature: float) -> torch.Tensor:
    """Straight-through Gumbel-softmax: the one-hot of ``argmax(logits + gumbel)`` forward,
    the gradient of ``softmax((logits + gumbel) / temperature)`` backward."""
    soft = ((logits + gumbel) / temperature).softmax(-1)
    hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
    return hard - soft.detach() + soft


def gumbel_noise(shape, generator: torch.Generator, device) -> torch.Tensor:
    """Standard Gumbel samples ``-log(E)``, ``E ~ Exp(1)``."""
    return -torch.empty(shape, device=device).exponential_(generator=generator).log_()


class MultiAgentActor(nn.Module):
    """Deterministic decentralised actors: ``pre(obs [B, A, D]) -> [B, A, K]`` (logits, or
    pre-tanh values), one shared MLP (agent id in its input) or ``A`` batched MLPs."""

    def __init__(self, layout: AgentLayout, hidden, activation: str, shared: bool, agent_id: bool):
        super().__init__()
        self.layout, self.shared, self.agent_id = layout, shared, shared and agent_id
        A, K = layout.n_agents, layout.n_actions
        self.register_buffer("eye", torch.eye(A), persistent=False)
        if shared:
            self.net = MLP(layout.obs_dim + (A if self.agent_id else 0), tuple(hidden), activation, out_dim=K)
        else:
            self.net = ParallelMLP(A, layout.obs_dim, tuple(hidden), activation, out_dim=K, out_gains=(1.0,) * A)
        if not layout.discrete:
            low = torch.tensor(layout.act_low, dtype=torch.float32)
            high = torch.tensor(layout.act_high, dtype=torch.float32)
            dims = torch.zeros(A, K)
            for j, n in enumerate(layout.act_sizes):
                dims[j, :n] = 1.0
        else:
            low = high = dims = torch.ones(A, K)
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("high", high, persistent=False)
        self.register_buffer("dims", dims, persistent=False)  # an agent's own action dims (Box padding: 0)

    def pre(self, obs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            if self.agent_id:
                B, A = obs.shape[:2]
                obs = torch.cat([obs, self.eye.expand(B, A, A)], -1)
            return self.net(obs)
        return self.net(obs.transpose(0, 1)).transpose(0, 1)

    @staticmethod
    def valid(view: AgentView) -> torch.Tensor:
        """Valid actions ``[B, A, K]``; every action for an absent agent (its row is unused)."""
        return view.action_mask | ~view.agent_mask.unsqueeze(-1)

    def logits(self, pre: torch.Tensor, view: AgentView) -> torch.Tensor:
        return pre.masked_fill(~self.valid(view), float("-inf"))

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        return self.low + (unit + 1.0) * 0.5 * (self.high - self.low)

    def to_unit(self, env_action: torch.Tensor) -> torch.Tensor:
        return ((env_action - self.low) / (self.high - self.low) * 2.0 - 1.0).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, packed: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        """Env actions ``[N, A]`` (indices) or ``[N, A, K]``; ``deterministic=False`` samples the
        categorical (discrete) and is the same as deterministic for continuous actions."""
        view = self.layout.split(packed)
        pre = self.pre(view.obs)
        if not self.layout.discrete:
            return self.to_env(pre.tanh())
        logits = self.logits(pre, view)
        if not deterministic:
            logits = logits + gumbel_noise(logits.shape, generator, logits.device)
        return logits.argmax(-1)


class MADDPG(DelayedActor, OffPolicy):
    """MADDPG; ``matd3`` is this class with twin critics, target smoothing and a delayed actor."""

    name = "maddpg"
    Config = MADDPGConfig
    multi_agent = True
    networks = ("actor", "critics", "actor_target", "critics_target")
    optimizers = ("actor_opt", "critic_opt")

    def __init__(self, cfg: MADDPGConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        layout = require_layout(type(self).name, obs_space)
        if cfg.normalize_obs:
            raise UserError(f"{type(self).name}.normalize_obs is not built for multi-agent networks; leave it false")
        self.layout = layout
        self.per_agent = cfg.rewards == "agent"
        self.reward_shape = (layout.n_agents,) if self.per_agent else ()
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        A, K = layout.n_agents, layout.n_actions
        x_dim = layout.state_dim if cfg.critic_input == "state" else A * layout.obs_dim
        self.actor = self._build(lambda: MultiAgentActor(layout, cfg.hidden, cfg.activation, cfg.shared_actor,
                                                         cfg.agent_id).to(device))
        self.critics = self._build(lambda: Critics(x_dim, A * K, cfg.n_critics, tuple(cfg.hidden),
                                                   cfg.activation, n_out=A if self.per_agent else 1).to(device))
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_opt = self._optimizer(self.actor.parameters(), cfg.actor_lr or cfg.lr)
        self.critic_opt = self._optimizer(self.critics.parameters(), cfg.lr)

    def store(self, step) -> None:
        if not self.per_agent:
            return super().store(step)
        if step.agents is None:
            raise UserError(f"{type(self).name}.rewards=agent needs per-agent rewards (info['agents']): run it on a "
                            "corral.envs.multiagent env")
        self.replay.add(step.obs, step.extras.action, step.agents.reward, step.terminated, step.truncated,
                        step.final_obs)

    # --- acting
    def explore(self, obs):
        cfg, actor, L = self.cfg, self.actor, self.layout
        g = self.rng["noise"]
        view = L.split(obs)
        warmup = self.env_steps < cfg.learning_starts
        if L.discrete:
            # random valid actions (warm-up) or the policy's categorical, both as a Gumbel-max
            logits = torch.zeros(view.action_mask.shape, device=self.device) if warmup else actor.pre(view.obs)
            action = (actor.logits(logits, view) + gumbel_noise(logits.shape, g, self.device)).argmax(-1)
            return action, Action(action)
        shape = (obs.shape[0], L.n_agents, L.n_actions)
        if warmup:
            unit = torch.rand(shape, generator=g, device=self.device) * 2 - 1
        else:
            noise = torch.randn(shape, generator=g, device=self.device)
            unit = (actor.pre(view.obs).tanh() + cfg.exploration_noise * noise).clamp(-1.0, 1.0)
        env_action = actor.to_env(unit)
        return env_action, Action(env_action)

    def act(self, obs, deterministic: bool = True):
        return self.actor.act(obs, deterministic, self.rng["action"])

    def act_dict(self, obs: dict, deterministic: bool = True) -> dict:
        """``{agent: observation}`` of one env -> ``{agent: action}`` (see ``corral.algos.mappo.act_dict``)."""
        return act_dict(self, obs, deterministic)

    # --- the critic's inputs
    def critic_x(self, view: AgentView) -> torch.Tensor:
        if self.cfg.critic_input == "state":
            return view.state
        return (view.obs * view.agent_mask.unsqueeze(-1)).flatten(-2)

    def joint(self, action: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Per-agent actions ``[..., A, K]`` (unit scale or one-hot) -> the critic's joint action
        ``[..., A * K]``, absent agents' and padded dims zeroed."""
        return (action * present.unsqueeze(-1) * self.actor.dims).flatten(-2)

    def q(self, critics, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[n_critics, B]`` (team), or ``[n_critics, B, A]`` (a head per agent, one agent too)."""
        out = critics(x, action)
        return out.unsqueeze(-1) if self.per_agent and out.dim() == 2 else out

    def stored(self, action: torch.Tensor) -> torch.Tensor:
        """Replayed env actions -> ``[B, A, K]`` one-hot or unit-scale actions."""
        if self.layout.discrete:
            return F.one_hot(action.long(), self.layout.n_actions).float()
        return self.actor.to_unit(action)

    def target_actions(self, view: AgentView, noise: dict) -> torch.Tensor:
        """The target actors' actions ``[B, A, K]`` on the next observations."""
        cfg, actor = self.cfg, self.actor_target
        pre = actor.pre(view.obs)
        if self.layout.discrete:
            logits = actor.logits(pre, view)
            if "target" in noise:
                logits = logits + noise["target"]
            return F.one_hot(logits.argmax(-1), self.layout.n_actions).float()
        unit = pre.tanh()
        if "target" in noise:
            smoothing = (noise["target"] * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            unit = (unit + smoothing).clamp(-1.0, 1.0)
        return unit

    def td_target(self, batch, noise: dict) -> torch.Tensor:
        nxt = self.layout.split(batch.next_obs)
        next_action = self.joint(self.target_actions(nxt, noise), nxt.agent_mask)
        next_q = self.q(self.critics_target, self.critic_x(nxt), next_action).min(0).values  # [B] or [B, A]
        discount = batch.discount.unsqueeze(-1) if self.per_agent else batch.discount
        return batch.reward + discount * next_q

    def draw_noise(self, batch_size):
        L, g = self.layout, self.rng["noise"]
        shape = (batch_size, L.n_agents, L.n_actions)
        noise = {}
        if self.cfg.target_noise > 0:
            noise["target"] = gumbel_noise(shape, g, self.device) if L.discrete else \
                torch.randn(shape, generator=g, device=self.device)
        if L.discrete and self._actor_step():
            noise["gumbel"] = gumbel_noise(shape, g, self.device)
        return noise

    def policy_actions(self, pre: torch.Tensor, view: AgentView, noise: dict) -> torch.Tensor:
        """The online actors' differentiable actions ``[B, A, K]``."""
        if self.layout.discrete:
            return gumbel_softmax(self.actor.logits(pre, view), noise["gumbel"], self.cfg.gumbel_temperature)
        return pre.tanh()

    def phases(self, batch, noise, shared=None):
        cfg, L = self.cfg, self.layout
        view = L.split(batch.obs)
        present = view.agent_mask
        x = self.critic_x(view)
        replayed = self.stored(batch.action)
        with torch.no_grad():
            target = self.td_target(batch, noise)
        q = self.q(self.critics, x, self.joint(replayed, present))  # [n_critics, B] ([n_critics, B, A] per agent)
        td = q - target
        if self.per_agent:  # each agent's head learns from the steps it acted in
            td = td * present
            td_row = td.abs().amax(-1)
            sq = td.square().sum(-1) / present.sum(-1).clamp(min=1)
        else:
            td_row = td.abs()
            sq = td.square()
        sq = sq * batch.weights if cfg.prioritized else sq
        critic_loss = sq.mean(1).sum()
        yield self.critic_opt, critic_loss
        stats = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean(), "target_mean": target.mean()}

        if self._actor_step():
            # agent i's variant of the joint action: its own from the policy, the others' replayed
            pre = self.actor.pre(view.obs)
            mine = self.policy_actions(pre, view, noise)  # [B, A, K]
            own = self.actor.eye.bool()[None, :, :, None]  # [1, i, j, 1]
            variants = torch.where(own, mine.unsqueeze(1), replayed.unsqueeze(1))  # [B, i, A, K]
            B, A = present.shape
            xs = x.unsqueeze(1).expand(B, A, x.shape[-1]).reshape(B * A, -1)
            self.critics.requires_grad_(False)  # only the actor steps; the critic passes gradients through
            try:
                q_i = self.q(self.critics, xs, self.joint(variants, present.unsqueeze(1)).reshape(B * A, -1))[0]
                # variant i scored by the team critic, or by agent i's own head
                q_i = q_i.view(B, A, A).diagonal(dim1=1, dim2=2) if self.per_agent else q_i.view(B, A)
                weight = present.float() / present.sum(1, keepdim=True).clamp(min=1)
                reg = (pre.square() * self.actor.dims).sum(-1) / self.actor.dims.sum(-1)
                actor_loss = ((-q_i + cfg.action_reg * reg) * weight).sum(1).mean()
                yield self.actor_opt, actor_loss
            finally:
                self.critics.requires_grad_(True)
            stats["actor_loss"] = actor_loss.detach()
        return stats, (td_row.detach().max(0).values if cfg.prioritized else None)
