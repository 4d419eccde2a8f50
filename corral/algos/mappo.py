"""MAPPO and IPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative
Multi-Agent Games"; de Witt et al. 2020 for IPPO) on PPO's update loop.

The agent dimension is folded into the batch: a vector step of ``N`` envs with ``A`` agents
is ``N * A`` rollout columns (``corral.actors.multiagent``), each column one agent's own
sequence of observations, actions, rewards and flags, so GAE (``corral.returns.gae``) runs
per agent with that agent's termination and truncation. One actor-critic is shared by all
agents, with a one-hot agent id in its inputs (``agent_id``). ``mappo``: the value sees the
global state (the env's ``state()``, else the agents' observations concatenated) plus the
agent id; ``ippo``: the value sees the agent's own observation.

What differs from PPO, each a hook override:

* ``observe`` stores per-agent rewards and flags (``Step.agents``) and which agents acted;
  a step in which an agent was absent is stored as terminated, so no return flows across it;
* ``prepare_batch`` keeps only the rows of agents that acted: absent agents' steps add
  nothing to any loss, to the value normalizer or to the advantage statistics. Advantages
  are normalized once over the whole batch (all agents, all steps), as the MAPPO code does;
* value normalization (``value_norm``, MAPPO's ``ValueNorm``): the value head predicts
  normalized values; GAE reads them denormalized, the value loss compares normalized ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from corral.actors.multiagent import MultiAgentActorCritic
from corral.actors.pixel_agents import OnFrames, PixelAgentsActorCritic
from corral.algos.base import Step
from corral.algos.mappo_pixels import check_pixel_run
from corral.algos.onpolicy import PPOBatch, PPOExtras, normalized
from corral.algos.ppo import PPO, PPOConfig, ppo_loss
from corral.config import option
from corral.envs.multiagent import require_layout
from corral.errors import UserError
from corral.returns import gae, rollout_next_values


@dataclass
class MAPPOConfig(PPOConfig):
    centralized_value: bool = option(True, "the value sees the global state (MAPPO); false: the agent's own "
                                           "observation (IPPO)")
    agent_id: bool = option(True, "a one-hot agent id in the shared policy's and value's inputs (with "
                                   "share_params only: per-agent weights need none)")
    share_params: bool = option(True, "one policy and one value network for all agents; false: each agent its "
                                      "own policy and value weights, evaluated as one batched network over agents")
    value_norm: bool = option(True, "ValueNorm (MAPPO): running debiased mean/std of value targets; the value "
                                    "head predicts normalized values")
    value_norm_beta: float = option(0.99999, "ValueNorm's averaging weight", gt=0, lt=1)
    # MAPPO's MPE settings (Yu et al. 2022, appendix): one minibatch, 10 epochs, lr 7e-4, entropy 0.01
    n_steps: int = option(100, "env steps per env per rollout", ge=1)
    batch_size: int = option(0, "minibatch size in agent steps (0: the whole rollout, one minibatch)", ge=0)
    lr: float = option(7e-4, "Adam learning rate", gt=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    normalize_advantage: bool = option(True, "normalize advantages over the whole batch (all agents and steps)")


class MAPPO(PPO):
    """Multi-agent PPO with a shared actor-critic; ``ippo`` is this class with ``centralized_value=False``."""

    name = "mappo"
    grad_sharding = None  # PPO's minibatch sharding does not cover this update
    user_actor = False  # builds its own actor (make_actor)
    Config = MAPPOConfig
    multi_agent = True
    multi_agent_collectors = True  # collectors' fragments carry Step.agents; observe marks their boundaries

    def __init__(self, cfg: MAPPOConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        layout = require_layout(type(self).name, obs_space)
        for key in ("normalize_obs", "features"):
            if getattr(cfg, key):
                raise UserError(f"{type(self).name}.{key} is not built for multi-agent actors; leave it unset")
        if cfg.init != "orthogonal":
            raise UserError(f"{type(self).name}.init={cfg.init}: multi-agent actors are initialized orthogonally "
                            "only; leave init unset")
        self.layout = layout
        self.pixels = layout.pixels  # image observations: the CNN actor, rows point into self.frames
        self.memory_estimate = check_pixel_run(type(self).name, cfg, layout, num_envs, role, torch.device(device)) \
            if self.pixels else None
        # N envs of A agents: N * A rollout columns (env-major)
        super().__init__(cfg, obs_space, act_space, num_envs * layout.n_agents, device, rng, role)
        self.env_columns = num_envs  # what it was built with
        self.present = torch.zeros(cfg.n_steps, self.num_envs, dtype=torch.bool, device=device) if self.stores \
            else None
        # pixel envs: the rollout's packed uint8 steps, each stored once ([T * N, F]); rows point into it
        self.frames = torch.zeros(cfg.n_steps * num_envs, layout.size, dtype=torch.uint8, device=device) \
            if self.pixels and self.stores else None

    def make_actor(self):
        cfg = self.cfg
        if self.layout.pixels:
            return PixelAgentsActorCritic(self.layout, cfg.centralized_value, cfg.agent_id, tuple(cfg.hidden),
                                          cfg.activation, cfg.log_std_init, cfg.value_norm, cfg.value_norm_beta)
        return MultiAgentActorCritic(self.layout, cfg.centralized_value, cfg.agent_id, tuple(cfg.hidden),
                                     cfg.activation, cfg.log_std_init, cfg.value_norm, cfg.value_norm_beta,
                                     cfg.share_params)

    # --- acting and storing
    def explore(self, obs):
        env_action, action, log_prob, value, x = self.actor.explore(obs, self.rng["action"])
        if self.pixels:  # the packed step stored once; the rows point into it
            if self.frames is None:
                raise UserError(f"{self.name} on a pixel env collects in the learner's process: leave "
                                "scheme.collectors at 1")
            t, N = self.storage.step, self.env_columns
            self.frames[t * N:(t + 1) * N].copy_(obs)
            x = PixelAgentsActorCritic.pointer_rows(t, N, self.layout.n_agents, self.device)
        return env_action, PPOExtras(action, log_prob, value, x)

    def observe(self, step: Step):
        ag = step.agents
        if ag is None:
            raise UserError(f"{self.name}: the env step has no per-agent results (info['agents']); multi-agent "
                            "algorithms run on corral.envs.multiagent envs")
        ex = step.extras
        present = self.layout.split(step.obs).agent_mask.reshape(-1)
        reward = ag.reward.reshape(-1)
        terminated = ag.terminated.reshape(-1) | ~present  # an absent step ends whatever return flows into it
        truncated = ag.truncated.reshape(-1) & present
        if self.cfg.normalize_reward:
            reward = self._scale_reward(reward, terminated | truncated)  # the env's episodes
        if step.env_truncated is not None:  # a collector's fragment ends here: every column bootstraps
            truncated = truncated | (step.truncated.repeat_interleave(self.layout.n_agents) & present)
        self.present[self.storage.step] = present
        if self.pixels:  # V(final obs) now, from the packed final step (the network is the update's)
            final = torch.zeros_like(ex.value)
            if truncated.any():
                v = self.actor.value_norm.denormalize(self.actor.packed_value(step.final_obs))
                final = torch.where(truncated, v, final)
            self.storage.add(obs=ex.x, actions=ex.action, log_probs=ex.log_prob, values=ex.value, rewards=reward,
                             terminated=terminated, truncated=truncated, final_obs=ex.x, final_values=final)
        else:
            self.storage.add(obs=ex.x, actions=ex.action, log_probs=ex.log_prob, values=ex.value, rewards=reward,
                             terminated=terminated, truncated=truncated,
                             final_obs=self.actor.columns(step.final_obs)[0])
        self._last_obs = step.next_obs

    # --- values: the head predicts normalized values; GAE reads them denormalized
    def bootstrap_value(self, obs):
        with torch.no_grad():
            if self.pixels:
                return self.actor.value_norm.denormalize(self.actor.packed_value(obs))
            return self.actor.value_norm.denormalize(self.actor.value(self.actor.columns(obs)[0], stacked=obs.shape[0]))

    def final_values(self, truncated, final_obs):
        out = super().final_values(truncated, final_obs)
        return torch.where(truncated, self.actor.value_norm.denormalize(out), out)

    def prepare_batch(self) -> PPOBatch:
        cfg, data = self.cfg, self.storage.data
        if not self.pixels:  # pixel envs: stored by observe
            data.final_values.copy_(self.final_values(data.truncated, data.final_obs))
        with torch.no_grad():
            next_values = rollout_next_values(data.values, self.bootstrap_value(self._last_obs), data.truncated,
                                              data.final_values)
            adv, ret = gae(data.rewards, data.values, next_values, data.terminated, data.truncated, cfg.gamma,
                           cfg.gae_lambda)
        rows = self.present.reshape(-1).nonzero().squeeze(1)  # the agent steps that happened
        flat = data.flatten()
        adv, ret, values = adv.reshape(-1)[rows], ret.reshape(-1)[rows], flat.values[rows]
        norm = self.actor.value_norm
        norm.update(ret)
        if cfg.normalize_advantage:
            adv = normalized(adv)  # once, over batch and time (all agents)
        whole = cfg.batch_size <= 0 or cfg.batch_size >= rows.numel()
        return PPOBatch(flat.obs[rows], flat.actions[rows], flat.log_probs[rows], norm.normalize(values), adv,
                        norm.normalize(ret), whole)

    def minibatch_plan(self, batch: PPOBatch):
        if not self.pixels or batch.whole:
            yield from super().minibatch_plan(batch)
            return
        # pixel envs: an env step's agents in one minibatch (MAPPO's state CNN runs once for them), the
        # env steps shuffled each epoch; a row's env step is its pointer's frame index
        for _ in range(self.cfg.n_epochs):
            rank = torch.randperm(self.frames.shape[0], generator=self.rng["minibatch"], device=self.device)
            yield from torch.argsort(rank[batch.obs[:, 0]]).split(self.cfg.batch_size)

    def minibatch_loss(self, obs, actions, log_probs, values, adv, ret, clip: float, normalize_adv: bool):
        # advantages are normalized over the whole batch in prepare_batch, never per minibatch
        actor = OnFrames(self.actor, self.frames) if self.pixels else self.actor
        return ppo_loss(actor, obs, actions, log_probs, values, adv, ret, clip, self.cfg, False)

    def update(self, progress: float) -> dict[str, float]:
        agent_steps = int(self.present.sum())
        stats = super().update(progress)
        stats["agent_steps"] = float(agent_steps)
        return stats

    def extra_state(self):
        state = super().extra_state()
        if self.frames is not None and self.storage.step:  # a part rollout's frames (its rows point into them)
            state["frames"] = self.frames[:self.storage.step * self.env_columns].clone()
        return state

    def load_extra_state(self, state):
        super().load_extra_state(state)
        if self.frames is not None and "frames" in state:
            self.frames[:len(state["frames"])] = state["frames"]

    # --- users
    def act_dict(self, obs: dict, deterministic: bool = True) -> dict:
        """Actions for one env's observations given as PettingZoo gives them (``{agent: obs}``;
        an agent missing from the dict is absent). Box observations, or dicts with
        ``observation`` and ``action_mask``. Returns ``{agent: action}`` for the agents given."""
        if self.pixels:
            raise UserError(f"{self.name}.act_dict takes vector observations; on a pixel env, step corral's env "
                            "(corral.envs.make_vec_env) and call act() on its packed observations, which carry "
                            "the stacked frames")
        return act_dict(self, obs, deterministic)


def pack_dict(layout, obs: dict) -> np.ndarray:
    """One env's ``{agent: observation}`` -> a packed row (absent agents masked, no global
    state: decentralised acting reads only the agents' own observations)."""
    row = np.zeros(layout.size, np.float32)
    D = layout.obs_dim
    unknown = set(obs) - set(layout.agents)
    if unknown:
        raise UserError(f"act(): agents {sorted(unknown)} are not among the env's agents {list(layout.agents)}")
    for j, a in enumerate(layout.agents):
        if a not in obs:
            continue
        o = obs[a]
        mask = None
        if isinstance(o, dict):
            o, mask = o["observation"], o.get("action_mask")
        flat = np.asarray(o, np.float32).reshape(-1)
        if flat.size != layout.obs_dims[j]:
            raise UserError(f"act(): agent {a!r}'s observation has {flat.size} values, expected {layout.obs_dims[j]}")
        row[j * D:j * D + flat.size] = flat
        row[layout.mask_start + j] = 1.0
        if layout.discrete:
            s = layout.action_mask_start + j * layout.n_actions
            n = layout.act_sizes[j]
            row[s:s + n] = 1.0 if mask is None else np.asarray(mask, np.float32).reshape(-1)[:n]
    return row


def act_dict(algo, obs: dict, deterministic: bool = True) -> dict:
    layout = algo.layout
    x = torch.as_tensor(pack_dict(layout, obs), device=algo.device)[None]
    action = algo.act(x, deterministic=deterministic)[0].cpu().numpy()
    out = {}
    for j, a in enumerate(layout.agents):
        if a in obs:
            out[a] = int(action[j]) if layout.discrete else action[j, :layout.act_sizes[j]]
    return out
