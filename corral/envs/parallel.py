"""Resolving what names a multi-agent env (``mpe:NAME``, ``pettingzoo:family.name``,
``module:callable``, an instance or class) into PettingZoo ParallelEnvs, and checking their
spaces into an :class:`~corral.envs.agent_layout.AgentLayout` (see :mod:`corral.envs.multiagent`)."""

from __future__ import annotations

import copy
import difflib
import importlib
import math
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np

from corral.envs.agent_layout import AgentLayout
from corral.errors import UserError

EXTRA_HINT = "pip install 'corral[multiagent]'"


# Resolving what a user names


def _pettingzoo():
    try:
        import pettingzoo
    except ImportError:
        return None
    return pettingzoo


def is_pettingzoo_env(obj: Any) -> bool:
    """A PettingZoo ParallelEnv or AECEnv instance or class."""
    pz = _pettingzoo()
    if pz is None:
        return False
    kinds = (pz.ParallelEnv, pz.AECEnv)
    return isinstance(obj, kinds) or (isinstance(obj, type) and issubclass(obj, kinds))


def is_multiagent_spec(spec: Any) -> bool:
    """Whether ``spec`` names a multi-agent env without building one: ``mpe:`` and
    ``pettingzoo:`` ids, PettingZoo instances and classes. (A ``module:callable`` returning a
    PettingZoo env is multi-agent when a multi-agent algorithm asks for it.)"""
    if isinstance(spec, str):
        return spec.startswith(("mpe:", "pettingzoo:"))
    return is_pettingzoo_env(spec)


def _as_parallel(env: Any, name: str) -> Any:
    pz = _pettingzoo()
    if pz is None:
        raise UserError(f"env {name!r} is multi-agent and needs PettingZoo: {EXTRA_HINT}")
    if isinstance(env, pz.ParallelEnv):
        return env
    if isinstance(env, pz.AECEnv):
        from pettingzoo.utils.conversions import aec_to_parallel

        return aec_to_parallel(env)
    raise UserError(f"env {name!r} built {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv; "
                    "multi-agent algorithms take PettingZoo envs (mpe:NAME, pettingzoo:family.name, "
                    "module:callable returning one, or an instance)")


def _import_family(spec: str) -> Any:
    prefix, _, name = spec.partition(":")
    package = "mpe2" if prefix == "mpe" else "pettingzoo"
    try:
        importlib.import_module(package)
    except ImportError:
        raise UserError(f"env {spec!r} needs the {package} package: {EXTRA_HINT}") from None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError:
        known = []
        if package == "mpe2":
            import pkgutil

            import mpe2

            known = [m.name for m in pkgutil.iter_modules(mpe2.__path__) if m.name.endswith(tuple(f"_v{i}" for i in range(10)))]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(prefix + ':' + c for c in close)}?" if close else \
            (f"; available: {', '.join(sorted(known))}" if known else "")
        raise UserError(f"unknown multi-agent env {spec!r}: no module {package}.{name}{hint}") from None


class ParallelFactory:
    """A picklable zero-argument callable building one fresh ParallelEnv for a spec."""

    def __init__(self, spec: Any, kwargs: dict | None = None, opponents: tuple[str, ...] = ()):
        self.spec, self.kwargs, self.opponents = spec, dict(kwargs or {}), tuple(opponents)
        pz = _pettingzoo()
        if pz is not None and isinstance(spec, (pz.ParallelEnv, pz.AECEnv)) and self.kwargs:
            raise UserError("env kwargs cannot be applied to an env instance; pass its class or a factory")

    @property
    def name(self) -> str:
        from corral.envs.make import env_name

        return env_name(self.spec)

    def __call__(self) -> Any:
        spec, name = self.spec, self.name
        if isinstance(spec, str):
            if spec.startswith(("mpe:", "pettingzoo:")):
                module = _import_family(spec)
                build = getattr(module, "parallel_env", None)
                try:
                    if spec.startswith("mpe:") and callable(getattr(module, "env", None)):
                        from corral.envs.mpe import MPEParallel  # the parallel conversion with state hooks

                        env = MPEParallel(module.env(**self.kwargs))
                    elif build is not None and getattr(build, "__qualname__", "").startswith("parallel_wrapper_fn") \
                            and callable(getattr(module, "env", None)):
                        env = lean_parallel(module.env(**self.kwargs))  # PettingZoo's conversion, leaner
                    else:
                        env = build(**self.kwargs) if build is not None else module.env(**self.kwargs)
                except TypeError as e:
                    raise UserError(f"env {spec!r} rejected its kwargs {self.kwargs}: {e}") from None
            elif ":" not in spec:
                raise UserError(f"env {spec!r} is not a PettingZoo env; multi-agent algorithms take mpe:NAME, "
                                "pettingzoo:family.name, a module:callable returning a ParallelEnv or AECEnv, "
                                "or an instance")
            else:
                from corral.envs.make import _load_attr

                obj = _load_attr(spec)
                env = copy.deepcopy(obj) if is_pettingzoo_env(obj) and not isinstance(obj, type) else obj(**self.kwargs)
        elif isinstance(spec, type) or (callable(spec) and not is_pettingzoo_env(spec)):
            env = spec(**self.kwargs)
        else:
            env = copy.deepcopy(spec)
        env = _as_parallel(env, name)
        if self.opponents:
            from corral.envs.opponents import RandomOpponents

            env = RandomOpponents(env, self.opponents, name)
        return env


def lean_parallel(aec_env: Any) -> Any:
    """PettingZoo's ``aec_to_parallel`` (what a module's ``parallel_env`` built with
    ``parallel_wrapper_fn`` returns) without the ``last()`` it calls for every agent before
    stepping it, which builds that agent's observation and throws it away: in a pixel env one
    more screen copy per agent per step (pistonball: 20). Same steps, same results."""
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper

    class LeanAECToParallel(aec_to_parallel_wrapper):
        repeats_actions = True  # step(actions, repeat) holds the joint action (repeated_step)

        def step(self, actions, repeat: int = 1):
            """One parallel step; ``repeat`` > 1: the joint action held for that many cycles (rewards
            summed, stopping at a cycle that ends an agent), the observations built once at the end."""
            env = self.aec_env
            rewards: dict = defaultdict(int)
            for _ in range(repeat):
                for agent in env.agents:
                    if agent != env.agent_selection:
                        raise AssertionError(f"expected agent {agent} got agent {env.agent_selection}: the parallel "
                                             "conversion expects agents to step in a cycle")
                    env.step(actions[agent])
                    for a in env.agents:
                        rewards[a] += env.rewards[a]
                if not env.agents or any(env.terminations.values()) or any(env.truncations.values()):
                    break
            terminations, truncations, infos = dict(**env.terminations), dict(**env.truncations), dict(**env.infos)
            observations = {a: env.observe(a) for a in env.agents}
            while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
                env.step(None)
            self.agents = env.agents
            return observations, rewards, terminations, truncations, infos

    return LeanAECToParallel(aec_env)


def repeated_step(env: Any, actions: dict, repeat: int) -> tuple:
    """``env.step(actions)`` with the joint action held for ``repeat`` steps (frame skip): the
    per-agent rewards summed, the last step's observations, flags and infos; it stops early at a
    step that terminates or truncates an agent or changes who acts. A lean PettingZoo conversion
    (``lean_parallel``) builds the observations of the last step only."""
    if repeat == 1:
        return env.step(actions)
    if getattr(env, "repeats_actions", False):
        return env.step(actions, repeat)
    total: dict = defaultdict(float)
    for _ in range(repeat):
        obs, rewards, terms, truncs, infos = env.step(actions)
        for a, r in rewards.items():
            total[a] += r
        if any(terms.values()) or any(truncs.values()) or set(env.agents) != set(actions):
            break
    return obs, dict(total), terms, truncs, infos


# ---------------------------------------------------------------------------
# Spaces


def _obs_part(space: gym.Space) -> tuple[gym.Space, bool]:
    """(the observation part, whether it carries an action_mask) of one agent's space."""
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
        return space["observation"], "action_mask" in space.spaces
    return space, False


def _check_spaces(env: Any, name: str) -> AgentLayout:
    agents = tuple(env.possible_agents)
    if not agents:
        raise UserError(f"env {name!r} has no possible_agents")
    obs_dims, act_sizes, kinds = [], [], set()
    lows, highs = [], []
    for a in agents:
        part, _ = _obs_part(env.observation_space(a))
        if not isinstance(part, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)):
            raise UserError(f"env {name!r}: agent {a!r} observation space {part} is not supported "
                            "(Box, Discrete, MultiDiscrete, MultiBinary, or a Dict with 'observation' and 'action_mask')")
        obs_dims.append(int(gym.spaces.flatdim(part)))
        act = env.action_space(a)
        if isinstance(act, gym.spaces.Discrete):
            kinds.add("discrete")
            act_sizes.append(int(act.n))
        elif isinstance(act, gym.spaces.Box):
            kinds.add("box")
            act_sizes.append(int(math.prod(act.shape)))
            lows.append(np.asarray(act.low, np.float32).reshape(-1))
            highs.append(np.asarray(act.high, np.float32).reshape(-1))
        else:
            raise UserError(f"env {name!r}: agent {a!r} action space {act} is not supported (Discrete or Box)")
    if len(kinds) > 1:
        raise UserError(f"env {name!r} mixes Discrete and Box action spaces across agents; corral pads spaces of "
                        "one kind only")
    discrete = kinds == {"discrete"}
    K = max(act_sizes)
    low = high = ()
    if not discrete:
        pad = lambda v, fill: tuple(float(x) for x in np.concatenate([v, np.full(K - len(v), fill, np.float32)]))  # noqa: E731
        low = tuple(pad(v, -1.0) for v in lows)
        high = tuple(pad(v, 1.0) for v in highs)
    D = max(obs_dims)
    has_state = callable(getattr(env, "state", None))
    state_space = getattr(env, "state_space", None)
    try:
        if has_state:
            env.state()
    except NotImplementedError:  # PettingZoo's base class: the env has no global state
        has_state = False
    except Exception:  # state() before reset may fail (AttributeError too); the space says what it holds
        has_state = state_space is not None
    if has_state:
        S = int(gym.spaces.flatdim(state_space)) if state_space is not None else int(np.size(env.state()))
    else:
        S = len(agents) * D
    return AgentLayout(agents, D, tuple(obs_dims), S, has_state, discrete, K, tuple(act_sizes), low, high)
