"""Multi-agent envs: PettingZoo's Parallel API (AEC envs through PettingZoo's own
``aec_to_parallel``), MPE from ``mpe2`` by name, vectorised with corral's contract plus an
agent dimension.

What a user names:

* ``mpe:simple_spread_v3`` (any ``mpe2`` module: ``simple_adversary_v3``, ``simple_tag_v3``, ...);
* ``pettingzoo:butterfly.pistonball_v6`` (a module under ``pettingzoo``);
* ``package.module:callable`` or ``path/file.py:Name`` returning a ``ParallelEnv`` or an ``AECEnv``;
* a ``ParallelEnv`` / ``AECEnv`` instance (deep-copied per env) or class.

**Agents are a dimension.** ``MultiAgentVecEnv`` follows :mod:`corral.envs.base` (torch
tensors with a leading env dim, same-step autoreset, the true final observation,
``episode_done``) and adds, for the ``A = len(possible_agents)`` agents in a fixed order:

* an observation per env that is one flat float32 row packing ``obs [A, D]`` (each agent's
  observation flattened, zero-padded to the largest ``D``), the global ``state [S]`` (the
  env's ``state()`` where it has one, else the agents' padded observations concatenated; where
  ``state()`` raises or gives another size, as multiwalker's does once a walker has fallen, the
  agents' observations in blocks of ``S // A``, absent agents zeros),
  ``agent_mask [A]`` (1 where the agent will act on this observation) and, for discrete
  actions, ``action_mask [A, K]``. The observation space carries the :class:`AgentLayout`
  (``agent_layout(space)``), whose ``split(x)`` gives the structured view
  :class:`AgentView` (``obs [N, A, D]``, ``state [N, S]``, ``agent_mask [N, A]``,
  ``action_mask [N, A, K]``; views, no copies). Packing keeps the whole single-agent
  machinery (the Learner's loop, checkpoints of the current observation, evaluation,
  replay of observations) unchanged, and the final observation of an ended episode
  carries the final global state with it;
* ``reward [N]`` is the team reward: the mean of the rewards of the agents that acted this
  step (in a shared-reward game, the shared reward); ``terminated`` / ``truncated [N]`` are
  the env's episode flags (the episode is over when no agent is left; truncated when any
  agent was truncated at its last step, e.g. a time limit);
* ``info["agents"]``: an :class:`AgentStep` of per-agent ``reward``, ``terminated`` and
  ``truncated`` ``[N, A]`` (0 / False for agents that did not act);
* ``info["agent_returns"] [N, A]``: each agent's return over the episode that ended (valid
  where ``episode_done``); ``info["episode_return"]`` is the team return (the sum of team rewards).

**Absent agents.** Agents that terminate or leave vanish from PettingZoo's dicts. An
agent's slot is fixed by ``possible_agents``: a vanished agent's observation is zeros and its
``agent_mask`` 0 (it is never given an action), other agents' data never moves. The step in
which an agent ends still carries its last observation in its slot (PettingZoo returns it),
with ``agent_mask`` 0 after it, so an agent's final observation at step ``t`` is always
``final_obs[n, a]``. Where the episode ended, no agent acts again, and the final observation's
``agent_mask`` marks the agents that were truncated (cut off, so a team value target
bootstraps from them: QMIX, VDN) rather than agents that will act. An agent that vanishes without a termination or truncation flag is
reported terminated. Agents added mid-episode appear with ``agent_mask`` 1.

**Heterogeneous spaces are padded**: observations to the largest flat size with zeros;
Discrete actions to the largest ``n``, the padded actions masked off in ``action_mask``;
Box actions to the largest size (padded dims in [-1, 1], dropped before the env sees them).
Box and Discrete observations (Discrete one-hot) and ``Dict(observation=..., action_mask=...)``
observations are taken; an ``info[agent]["action_mask"]`` is read too.

**Pixel envs** (every agent observes an image: PettingZoo's butterfly family): the rows are
uint8, each agent's observation and the state a stack of grey, resized frames, as corral's
Atari envs give theirs (``env.pixels``; :mod:`corral.envs.ma_pixels`).

**State for exact resume**: where every env defines ``corral_state() -> dict`` (numpy arrays
and plain values) and ``corral_load_state(state)``, checkpoints hold it and a resumed run
continues the same episodes (``copyable``); otherwise a resumed run starts fresh episodes.
``mpe:NAME`` envs have these hooks (``corral.envs.mpe.MPEParallel``: entity positions,
velocities, colours, the step counter, the RNG state).
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corral.envs.agent_layout import (  # noqa: F401 (re-exported)
    AgentLayout,
    AgentStep,
    AgentView,
    agent_layout,
    is_multiagent_space,
    require_layout,
)
from corral.envs.base import EnvError
from corral.envs.host import tree_to_numpy, tree_to_torch
from corral.envs.ma_pixels import FrameStacks, pixel_layout, pixel_options
from corral.envs.parallel import (  # noqa: F401
    EXTRA_HINT,
    ParallelFactory,
    _check_spaces,
    _obs_part,
    is_multiagent_spec,
    is_pettingzoo_env,
    repeated_step,
)
from corral.errors import UserError


class MultiAgentVecEnv:
    """N PettingZoo ParallelEnvs in this process with corral's vector contract and an agent
    dimension (see the module docstring for what each tensor holds)."""

    copyable = False
    device_resident = False

    def __init__(self, factory: Any, num_envs: int, env_id: str = "env", device: str | torch.device = "cpu",
                 max_episode_steps: int | None = None, check_finite: bool = True, pixels: Any = None):
        if num_envs < 1:
            raise UserError(f"env.num_envs must be >= 1, got {num_envs}")
        self.factory, self.num_envs, self.env_id = factory, num_envs, env_id
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.check_finite = check_finite
        self.envs = [factory() for _ in range(num_envs)]
        self.layout = L = _check_spaces(self.envs[0], env_id)
        self._agent_index = {a: j for j, a in enumerate(L.agents)}
        self._obs_parts = [_obs_part(self.envs[0].observation_space(a)) for a in L.agents]
        P = pixel_layout(self.envs[0], L, [p for p, _ in self._obs_parts], pixels, env_id)
        self.skip = 1  # frame skip (env.pixels.skip): env steps a vector step holds each joint action
        self.frames = None  # image observations: stacks of preprocessed frames, packed as uint8
        self.dtype = np.float32
        if P is not None:
            if undrawn(self.envs[0], factory):  # rebuilt drawing their screens (rgb_array)
                for e in self.envs:
                    e.close()
                factory.kwargs["render_mode"] = "rgb_array"
                self.envs = [factory() for _ in range(num_envs)]
            self.layout = L = P
            self.frames, self.dtype = FrameStacks(L, num_envs, pixels), np.uint8
            self.skip = pixel_options(pixels).skip
            box = gym.spaces.Box(0, 255, (L.size,), np.uint8)
        else:
            box = gym.spaces.Box(-np.inf, np.inf, (L.size,), np.float32)
        box.corral_agents = L  # travels with the space, as corral_layout does
        self.single_observation_space = box
        self.single_action_space = L.action_space()
        self.copyable = all(callable(getattr(e, "corral_state", None)) and callable(getattr(e, "corral_load_state", None))
                            for e in self.envs)
        A = L.n_agents
        self.steps = 0
        self.ep_ret = np.zeros((num_envs, A), np.float64)
        self.ep_team = np.zeros(num_envs, np.float64)
        self.ep_len = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)  # steps into each env's episode (the episode cap)
        self.live: list[set] = [set() for _ in range(num_envs)]
        self._amask_info: list[dict] = [{} for _ in range(num_envs)]
        self.state_fallbacks = 0  # packed rows whose state is the agents' observations (state() failed)
        self._warned_fallback = False
        self._state_error = ""

    # --- packing
    def _pack(self, i: int, env: Any, obs: dict, row: np.ndarray, infos: dict) -> None:
        """Write env ``i``'s observation dict into ``row`` (zeroed by the caller)."""
        L = self.layout
        D, A = L.obs_dim, L.n_agents
        live = self.live[i]
        ms = L.mask_start
        for a, o in obs.items():
            j = self._agent_index.get(a)
            if j is None:
                raise EnvError(f"env {self.env_id!r} (index {i}) returned an observation for agent {a!r}, "
                               f"which is not in its possible_agents {list(L.agents)}")
            part, has_mask = self._obs_parts[j]
            value = o["observation"] if has_mask else o
            if self.frames is not None:
                self.frames.agent(i, j, value, row)
            else:
                row[j * D:j * D + L.obs_dims[j]] = gym.spaces.flatten(part, value)
            if a in live:
                row[ms + j] = 1.0
            if L.discrete:
                start = L.action_mask_start + j * L.n_actions
                am = o.get("action_mask") if has_mask else (infos.get(a) or {}).get("action_mask")
                if am is None:
                    row[start:start + L.act_sizes[j]] = 1.0
                else:
                    row[start:start + L.act_sizes[j]] = np.asarray(am, np.float32).reshape(-1)[:L.act_sizes[j]]
        if self.frames is not None:
            self.frames.global_state(i, env, row)
            return
        if not L.has_state:
            row[L.state_start:ms] = row[:L.state_start]
            return
        state = self._env_state(env)
        if state is not None:
            row[L.state_start:ms] = state
            return
        # the env cannot give its state now (multiwalker after a walker fell): the agents'
        # observations instead, each in a block of S // A entries (cut or zero-padded), absent
        # agents zeros
        self.state_fallbacks += 1
        block = L.state_dim // A
        n = min(block, D)
        for j in range(A):
            if L.agents[j] in obs:
                row[L.state_start + j * block:L.state_start + j * block + n] = row[j * D:j * D + n]
        if live and not self._warned_fallback:
            self._warned_fallback = True
            warnings.warn(f"env {self.env_id!r} (index {i}): state() failed while agents still act "
                          f"({self._state_error}); the global state is the agents' observations where it "
                          "fails (docs/multiagent.md)", stacklevel=2)

    def _env_state(self, env: Any) -> np.ndarray | None:
        """The env's global state as a float32 vector of the layout's size, or None where the env
        cannot give it (``state()`` raises or returns another size)."""
        try:
            state = np.asarray(env.state(), np.float32).reshape(-1)
        except Exception as e:  # noqa: BLE001 - any failure of the env's own state(): fall back
            self._state_error = f"{type(e).__name__}: {e}"
            return None
        if state.size != self.layout.state_dim:
            self._state_error = f"it returned {state.size} values, not {self.layout.state_dim}"
            return None
        return state

    def _reset_env(self, i: int, seed: int | None, row: np.ndarray) -> None:
        env = self.envs[i]
        try:
            obs, infos = env.reset(seed=seed)
        except Exception as e:
            raise EnvError(f"env {self.env_id!r} (index {i}) raised in reset: {type(e).__name__}: {e}") from e
        self.live[i] = set(env.agents)
        self.t[i] = 0
        if self.frames is not None:
            self.frames.restart(i)
        self._pack(i, env, obs, row, infos or {})

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(arr)
        return t if self.device.type == "cpu" else t.to(self.device)

    # --- the contract
    def reset(self, seed: int | None = None) -> torch.Tensor:
        out = np.zeros((self.num_envs, self.layout.size), self.dtype)
        for i in range(self.num_envs):
            self._reset_env(i, None if seed is None else seed + i, out[i])
        self.ep_ret[:] = 0.0
        self.ep_team[:] = 0.0
        self.ep_len[:] = 0
        if self.frames is not None:
            self.frames.warn_if_black(self.env_id)
        if self.check_finite and self.frames is None:
            self._check(out, "observation")
        return self._tensor(out)

    def _actions(self, action: Any) -> np.ndarray:
        L = self.layout
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(np.asarray(action))
        want = (self.num_envs, L.n_agents) if L.discrete else (self.num_envs, L.n_agents, L.n_actions)
        if tuple(action.shape) != want:
            raise EnvError(f"env {self.env_id!r}: action has shape {tuple(action.shape)}, expected {want} "
                           f"(one action per agent for {self.num_envs} envs of {L.n_agents} agents)")
        if L.discrete and action.dtype.is_floating_point:
            raise EnvError(f"env {self.env_id!r}: discrete actions must be integers, got {action.dtype}; "
                           "cast them with .long()")
        return action.detach().cpu().numpy()

    def _joint(self, i: int, env: Any, acts: np.ndarray) -> dict:
        """Env ``i``'s joint action dict for its live agents from their rows of ``acts``."""
        L = self.layout
        joint = {}
        for a in self.live[i]:
            j = self._agent_index[a]
            if L.discrete:
                v = int(acts[j])
                if not 0 <= v < L.act_sizes[j]:
                    raise EnvError(f"env {self.env_id!r}: action {v} for agent {a!r} (env index {i}) is outside "
                                   f"its action space Discrete({L.act_sizes[j]})")
                joint[a] = v
            else:
                space = env.action_space(a)
                joint[a] = np.clip(acts[j, :L.act_sizes[j]], space.low.reshape(-1), space.high.reshape(-1)) \
                    .astype(space.dtype).reshape(space.shape)
        return joint

    def _agent_results(self, i: int, env: Any, acting: set, out: tuple, rew: np.ndarray, term: np.ndarray,
                       trunc: np.ndarray) -> None:
        """Fill env ``i``'s per-agent ``rew``/``term``/``trunc`` rows from its step's dicts ``out``
        and update its live agents (the episode cap truncates every one still live)."""
        o, r, te, tr = out
        index = self._agent_index
        for a in acting:
            j = index[a]
            rew[j] = float(r.get(a, 0.0))
            gone = a not in o and a not in te and a not in tr
            term[j] = bool(te.get(a, False)) or gone  # vanished without a flag: terminated
            trunc[j] = bool(tr.get(a, False)) and not term[j]
        self.live[i] = set(env.agents) - {a for a in acting if term[index[a]] or trunc[index[a]]}
        if self.max_episode_steps is not None and self.t[i] >= self.max_episode_steps and self.live[i]:
            for a in self.live[i]:
                if a in acting:
                    trunc[index[a]] = True
            self.live[i] = set()

    def step(self, action: Any):
        L = self.layout
        acts = self._actions(action)
        N, A = self.num_envs, L.n_agents
        obs = np.zeros((N, L.size), self.dtype)
        final = None
        rew = np.zeros((N, A), np.float32)
        term = np.zeros((N, A), bool)
        trunc = np.zeros((N, A), bool)
        team = np.zeros(N, np.float32)
        env_term = np.zeros(N, bool)
        env_trunc = np.zeros(N, bool)
        agent_returns = None
        for i, env in enumerate(self.envs):
            acting = self.live[i]
            try:
                o, r, te, tr, infos = repeated_step(env, self._joint(i, env, acts[i]), self.skip)
            except Exception as e:
                raise EnvError(f"env {self.env_id!r} (index {i}) raised at vector step {self.steps}: "
                               f"{type(e).__name__}: {e}") from e
            self.t[i] += 1
            self._agent_results(i, env, acting, (o, r, te, tr), rew[i], term[i], trunc[i])
            if acting:
                team[i] = rew[i, [self._agent_index[a] for a in acting]].mean()
            self.ep_ret[i] += rew[i]
            self.ep_team[i] += team[i]
            self.ep_len[i] += 1
            self._pack(i, env, o, obs[i], infos or {})
            if not self.live[i]:  # the episode is over: no agent left to act
                # a final observation's agent mask marks the agents cut off by truncation (whose values
                # a target bootstraps), not agents that will act: none will
                obs[i, L.mask_start:L.action_mask_start] = trunc[i]
                if final is None:
                    final = obs.copy()
                else:
                    final[i] = obs[i]
                env_trunc[i] = bool(trunc[i].any())
                env_term[i] = not env_trunc[i]
                if agent_returns is None:
                    agent_returns = np.zeros((N, A), np.float32)
                    ep_team, ep_len = np.zeros(N, np.float32), np.zeros(N, np.int64)
                agent_returns[i] = self.ep_ret[i]
                ep_team[i], ep_len[i] = self.ep_team[i], self.ep_len[i]
                self.ep_ret[i] = 0.0
                self.ep_team[i] = 0.0
                self.ep_len[i] = 0
                obs[i] = 0.0
                self._reset_env(i, None, obs[i])
        if self.check_finite:
            self._check(rew, "reward")
        if self.check_finite and self.frames is None:
            self._check(obs, "observation")
            if final is not None:
                self._check(final, "final observation")
        self.steps += 1
        t = self._tensor
        obs_t = t(obs)
        done = env_term | env_trunc
        info = {
            "final_obs": obs_t if final is None else t(final),
            "episode_done": t(done),
            "episode_return": t(ep_team) if agent_returns is not None else t(np.zeros(N, np.float32)),
            "episode_length": t(ep_len) if agent_returns is not None else t(np.zeros(N, np.int64)),
            "agent_returns": t(agent_returns if agent_returns is not None else np.zeros((N, A), np.float32)),
            "agents": AgentStep(t(rew), t(term), t(trunc)),
        }
        return obs_t, t(team), t(env_term), t(env_trunc), info

    def _check(self, arr: np.ndarray, what: str) -> None:
        if np.isfinite(arr).all():
            return
        i = int(np.nonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))[0][0])
        raise EnvError(f"env {self.env_id!r} (index {i}) returned a non-finite {what} at vector step {self.steps}; "
                       "fix the env or wrap it to keep values finite")

    # --- state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"copyable": self.copyable, "steps": self.steps, "ep_ret": self.ep_ret.copy(),
                                 "ep_team": self.ep_team.copy(), "ep_len": self.ep_len.copy(), "t": self.t.copy()}
        if self.copyable:
            state["envs"] = [e.corral_state() for e in self.envs]
            state["live"] = [[a in live for a in self.layout.agents] for live in self.live]
        return tree_to_torch(state)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; True when the envs' internals were restored (episodes continue)."""
        state = tree_to_numpy(state)
        self.steps = int(state.get("steps", 0))
        if not (state.get("copyable") and self.copyable and "envs" in state):
            return False
        for env, s in zip(self.envs, state["envs"]):
            env.corral_load_state(s)
        self.live = [{a for a, on in zip(self.layout.agents, row) if on} for row in state["live"]]
        self.ep_ret[:], self.ep_team[:] = state["ep_ret"], state["ep_team"]
        self.ep_len[:], self.t[:] = state["ep_len"], state["t"]
        return True

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"MultiAgentVecEnv({self.env_id!r}, num_envs={self.num_envs}, agents={list(self.layout.agents)})"


def undrawn(env: Any, factory: Any) -> bool:
    """Whether ``env`` observes images of a screen it draws only with a render mode, built without
    one: PettingZoo's butterfly envs (pistonball, cooperative_pong) skip their drawing when
    ``render_mode`` is None, so their agents would see a screen without the ball. True where the
    env offers ``rgb_array``, has no render mode, and the factory's kwargs can give it one (a
    ``render_mode`` the user set, None included, is kept)."""
    modes = (getattr(env, "metadata", None) or {}).get("render_modes", ())
    return (getattr(env, "render_mode", None) is None and "rgb_array" in modes
            and "render_mode" not in getattr(factory, "kwargs", {"render_mode": None})
            and isinstance(getattr(factory, "spec", None), (str, type)))


def make_multiagent_vec_env(spec: Any, num_envs: int, kwargs: dict | None = None, device: Any = "cpu",
                            backend: str = "sync", max_episode_steps: int | None = None,
                            check_finite: bool = True, opponents: tuple[str, ...] = (),
                            pixels: Any = None) -> MultiAgentVecEnv:
    """N copies of the multi-agent env ``spec`` names (see the module docstring); ``opponents``:
    agents that act at random and are not trained (``corral.envs.opponents``); ``pixels``: how
    image observations are preprocessed (``corral.envs.ma_pixels``)."""
    if backend != "sync":
        raise UserError(f"multi-agent envs run on env.backend=sync (in this process), not {backend!r}")
    factory = ParallelFactory(spec, kwargs, opponents)
    return MultiAgentVecEnv(factory, num_envs, factory.name, device, max_episode_steps, check_finite, pixels)


def random_team_return(env_id: str, opponents: tuple[str, ...], episodes: int, seed: int,
                       kwargs: dict | None = None, num_envs: int = 8, pixels: Any = None) -> float:
    """The baseline a trained side is measured against: the mean team return over ``episodes``
    episodes of ``env_id`` when the side's agents act uniformly at random too (each agent over
    its own actions), against the random ``opponents``; ``pixels``: a pixel env's options (its
    frame skip holds each random action as the trained team's are held)."""
    venv = make_multiagent_vec_env(env_id, num_envs, kwargs, opponents=opponents, pixels=pixels)
    g = torch.Generator().manual_seed(seed)
    L = venv.layout
    returns: list[float] = []
    try:
        venv.reset(seed=seed)
        while len(returns) < episodes:
            if L.discrete:
                u = torch.rand((venv.num_envs, L.n_agents), generator=g)
                action = (u * torch.tensor(L.act_sizes)).long()
            else:
                low, high = torch.tensor(L.act_low), torch.tensor(L.act_high)
                action = low + (high - low) * torch.rand((venv.num_envs, L.n_agents, L.n_actions), generator=g)
            _, _, _, _, info = venv.step(action)
            done = info["episode_done"]
            returns += info["episode_return"][done].tolist()
    finally:
        venv.close()
    return float(np.mean(returns[:episodes]))
