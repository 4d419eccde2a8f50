"""Turning what a user names into env factories: Gymnasium ids, ``module:callable``,
``path/to/file.py:Name``, names registered with :func:`register`, ``gymnasium.Env``
classes and instances. Errors here are user errors with a fix in the message."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from corral.envs.pybullet import KNOWN_IDS as BULLET_IDS
from corral.envs.pybullet import QuietBullet, is_bullet_id, is_bullet_name, register_pybullet
from corral.errors import UserError

EnvFactory = Callable[[], gym.Env]

_REGISTRY: dict[str, Callable[..., gym.Env]] = {}

# Which extra brings the package an env family needs, keyed by entry-point module prefix.
_EXTRAS = {
    "gymnasium.envs.box2d": "box2d",
    "gymnasium.envs.mujoco": "mujoco",
    "ale_py": "atari",
    "shimmy": "atari",
    "minigrid": "minigrid",
    "pybullet_envs_gymnasium": "pybullet",
}


# Families whose ids are registered when their package is imported: (id prefixes, module, extra).
# An id with such a prefix imports the module first (no --import needed), here and in workers.
_FAMILIES = (
    (("MiniGrid-", "BabyAI-"), "minigrid", "minigrid"),
)


def import_family(env_id: str) -> None:
    """Import the package that registers ``env_id``'s family (MiniGrid, BabyAI), if it has one
    and the id is not registered yet; a ``UserError`` naming the extra when it is missing."""
    if env_id in gym.registry:
        return
    for prefixes, module, extra in _FAMILIES:
        if env_id.startswith(prefixes):
            try:
                importlib.import_module(module)
            except ImportError:
                raise UserError(f"env {env_id!r} needs the {module} package: pip install 'corral[{extra}]'") from None
            return


def register(name: str, factory: Callable[..., gym.Env]) -> None:
    """Make ``name`` resolve to ``factory(**kwargs)`` everywhere corral takes an env."""
    if not callable(factory):
        raise TypeError(f"register({name!r}, ...): the factory must be callable, got {type(factory).__name__}")
    _REGISTRY[name] = factory


def env_name(spec: Any) -> str:
    """A short printable name for run directories and messages."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, gym.Env):
        return spec.spec.id if spec.spec is not None else type(spec).__name__
    if isinstance(spec, type):
        return spec.__name__
    return getattr(spec, "__name__", type(spec).__name__)


def env_ref(spec: Any) -> str:
    """How a config records an env given as an object: ``'module:name'`` for a class or function
    importable by that name (``corral.load``, ``corral resume`` and evaluation rebuild it from
    the config), else its printable name (an instance, a lambda, a nested class)."""
    mod, qual = getattr(spec, "__module__", None), getattr(spec, "__qualname__", "")
    if (isinstance(spec, type) or inspect.isfunction(spec)) and mod and qual.isidentifier():
        return f"{mod}:{qual}"
    return env_name(spec)


def _load_attr(spec: str, what: str = "env") -> Any:
    """The object ``module:attr`` or ``path/file.py:attr`` names (``what`` names it in errors)."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = os.path.abspath(target)
        if not os.path.exists(path):
            raise UserError(f"{what} {spec!r}: file {target!r} does not exist")
        mod_name = "_corral_user_env_" + os.path.splitext(os.path.basename(path))[0]
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise UserError(
                f"{what} {spec!r}: cannot import module {target!r} ({e}); make sure it is on PYTHONPATH "
                "or give a file path like path/to/file.py:ClassName"
            ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"{what} {spec!r}: {target!r} has no attribute {attr!r}{hint}") from None


def _missing_extra_hint(env_id: str) -> str:
    entry = gym.registry[env_id].entry_point
    entry = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    for prefix, extra in _EXTRAS.items():
        if entry.startswith(prefix):
            return f"pip install 'corral[{extra}]'"
    return "install the package that provides it"


# Entry points of envs that Gymnasium (or ALE) ships and tests: corral builds them without
# Gymnasium's PassiveEnvChecker, which checks an env's API on its first reset and step and
# is a pass-through call on every step after that.
_CHECKED_UPSTREAM = ("gymnasium.envs.", "ale_py")


def lean_spec(make_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``make_id`` without OrderEnforcing (a guard against stepping
    before reset, which corral's vector envs never do) and, for Gymnasium's and ALE's own
    envs, without the env checker: two Python calls fewer per env step. Any other
    registered env keeps Gymnasium's checker."""
    if ":" in make_id:  # Gymnasium's "module:EnvId": the module registers the id
        module, _, make_id = make_id.rpartition(":")
        importlib.import_module(module)
    spec = gym.spec(make_id)
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    upstream = entry.startswith(_CHECKED_UPSTREAM)
    return dataclasses.replace(spec, order_enforce=False, disable_env_checker=spec.disable_env_checker or upstream)


class _GymMake:
    """``gym.make`` of the id's lean spec (see :func:`lean_spec`) with ``kwargs``, and the
    Atari preprocessing for ALE ids. Picklable, so a worker process builds its envs from it."""

    max_episode_steps: int | None = None  # a cap below the id's own (gym.make's argument); Atari's is in ``atari``

    def __init__(self, make_id: str, env_id: str, kwargs: dict, atari: Any = None):
        self.make_id, self.env_id, self.kwargs, self.atari = make_id, env_id, kwargs, atari

    def __call__(self) -> gym.Env:
        if self.env_id.startswith("ALE/") or self.atari is not None:
            from corral.envs.atari import register_ale

            register_ale()  # a fresh worker process has not registered them yet
        import_family(self.env_id)  # MiniGrid, BabyAI: likewise
        if is_bullet_id(self.env_id) or (self.env_id not in gym.registry and is_bullet_name(self.env_id)):
            register_pybullet(self.env_id)  # likewise, with PyBullet's console messages kept quiet
        bullet = is_bullet_id(self.env_id)
        try:
            if self.atari is not None:
                from corral.envs.atari import make_atari

                return make_atari(self.make_id, self.kwargs, self.atari)
            if self.max_episode_steps is not None:
                env = gym.make(lean_spec(self.make_id), max_episode_steps=self.max_episode_steps, **self.kwargs)
            else:
                env = gym.make(lean_spec(self.make_id), **self.kwargs)
            return QuietBullet(env) if bullet else env
        except gym.error.DependencyNotInstalled as e:
            raise UserError(
                f"env {self.env_id!r} needs a package that is not installed: {_missing_extra_hint(self.env_id)} ({e})"
            ) from None
        except TypeError as e:
            raise UserError(f"env {self.env_id!r} rejected its kwargs {self.kwargs}: {e}") from None


class _Call:
    """``fn(**kwargs)``; picklable when ``fn`` is (cloudpickle takes lambdas too)."""

    def __init__(self, fn: Callable[..., gym.Env], kwargs: dict):
        self.fn, self.kwargs = fn, kwargs

    def __call__(self) -> gym.Env:
        return self.fn(**self.kwargs)


class _TimeLimited:
    """Another factory's env under ``gymnasium.wrappers.TimeLimit`` (an episode cap for envs
    that are not made from an id)."""

    def __init__(self, factory: EnvFactory, max_episode_steps: int):
        self.factory, self.max_episode_steps = factory, max_episode_steps

    def __call__(self) -> gym.Env:
        return gym.wrappers.TimeLimit(self.factory(), self.max_episode_steps)


class _Copy:
    """A deep copy of an env instance per call."""

    def __init__(self, template: gym.Env):
        self.template = template

    def __call__(self) -> gym.Env:
        return copy.deepcopy(self.template)


class _FromSpec:
    """``module:callable`` or ``file.py:Name``, resolved again in whichever process calls it
    (a worker imports the module or file itself)."""

    def __init__(self, spec: str, kwargs: dict):
        self.spec, self.kwargs = spec, kwargs
        self._obj: Any = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "kwargs": self.kwargs, "_obj": None}

    def __call__(self) -> gym.Env:
        if self._obj is None:
            self._obj = _load_attr(self.spec)
        if isinstance(self._obj, gym.Env):
            return copy.deepcopy(self._obj)
        return self._obj(**self.kwargs)


def _names_attr(spec: str) -> bool:
    """``module:callable`` or ``file.py:Name`` (not Gymnasium's ``module:EnvId``)."""
    if ":" not in spec or spec.startswith("native:"):
        return False
    return spec.rpartition(":")[0].endswith(".py") or not _is_gym_namespace_id(spec)


def _gym_factory(env_id: str, kwargs: dict, atari_wrappers: Any = True,
                 max_episode_steps: int | None = None) -> EnvFactory:
    make_id = env_id
    import_family(env_id)
    if env_id not in gym.registry:
        # Atari and other plugin families register on import.
        if env_id.startswith("ALE/"):
            from corral.envs.atari import register_ale

            if not register_ale():
                raise UserError(f"env {env_id!r} needs ale-py: pip install 'corral[atari]'")
        elif is_bullet_name(env_id):
            register_pybullet(env_id)  # pybullet-envs-gymnasium registers its ids on import
        else:
            from corral.envs.atari import resolve_short_name

            env_id = make_id = resolve_short_name(env_id) or env_id
    if env_id not in gym.registry:
        known = list(dict.fromkeys([*gym.registry.keys(), *_REGISTRY, *BULLET_IDS]))
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `corral list` shows the env families"
        raise UserError(f"unknown env {env_id!r}{hint}")
    atari = None
    from corral.envs.atari import atari_options, is_ale_id

    if is_ale_id(env_id):
        atari = atari_options(atari_wrappers)
        if atari is not None and max_episode_steps is not None:
            # ALE's own frame cap, below the wrapper that reports the game's score
            atari = dataclasses.replace(atari, max_episode_steps=max_episode_steps)
            max_episode_steps = None
    factory = _GymMake(make_id, env_id, kwargs, atari)
    factory.max_episode_steps = max_episode_steps
    return factory


def make_factory(spec: Any, kwargs: dict | None = None, atari_wrappers: Any = True,
                 max_episode_steps: int | None = None) -> EnvFactory:
    """Return a zero-argument callable building one fresh env for ``spec``.

    String specs give picklable factories that resolve the spec again where they are
    called, so worker processes build their own envs. ``atari_wrappers`` applies to ALE
    ids (see :func:`corral.envs.atari.atari_options`). ``max_episode_steps`` truncates
    episodes after that many steps: ``gym.make``'s cap for an id (in place of its own),
    ALE's frame cap (``max_episode_steps * frame_skip`` frames) for a preprocessed Atari
    game, a ``TimeLimit`` around anything else."""
    if max_episode_steps is not None and not (isinstance(spec, str) and spec not in _REGISTRY
                                              and not _names_attr(spec)):
        return _TimeLimited(make_factory(spec, kwargs, atari_wrappers), max_episode_steps)
    kwargs = dict(kwargs or {})
    if isinstance(spec, gym.Env):
        if kwargs:
            raise UserError("env kwargs cannot be applied to an env instance; pass its class or a factory")
        return _Copy(spec)
    if callable(spec) and not isinstance(spec, str):
        return _Call(spec, kwargs)
    if not isinstance(spec, str):
        raise UserError(f"cannot make an env from {spec!r}: give an id, 'module:callable', a gymnasium.Env or a class")
    if spec in _REGISTRY:
        return _Call(_REGISTRY[spec], kwargs)
    if ":" in spec and not spec.startswith("native:"):
        target = spec.rpartition(":")[0]
        # "module:EnvId-v0" is also Gymnasium's own import-then-make syntax.
        obj = _load_attr(spec) if target.endswith(".py") or not _is_gym_namespace_id(spec) else None
        if obj is not None:
            if isinstance(obj, gym.Env):
                if kwargs:
                    raise UserError(f"env {spec!r} is an env instance; kwargs cannot be applied to it")
            elif not callable(obj):
                raise UserError(f"env {spec!r} names {type(obj).__name__}, which is not callable")
            return _FromSpec(spec, kwargs)
        factory = _gym_factory(spec.rpartition(":")[2], kwargs, atari_wrappers, max_episode_steps)
        factory.make_id = spec  # gym.make imports the module itself
        return factory
    return _gym_factory(spec, kwargs, atari_wrappers, max_episode_steps)


def _is_gym_namespace_id(spec: str) -> bool:
    module, _, name = spec.rpartition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return not hasattr(mod, name) and name in gym.registry


def check_env(env: gym.Env, name: str) -> None:
    """Refuse spaces corral does not handle yet, with the fix."""
    from gymnasium import spaces

    if not isinstance(env.action_space, (spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        raise UserError(
            f"env {name!r}: action space {env.action_space} is not supported yet "
            "(Discrete, Box, MultiDiscrete and MultiBinary are)"
        )
    if not isinstance(env.observation_space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        raise UserError(
            f"env {name!r}: observation space {env.observation_space} is not supported yet (Box, Discrete, "
            "MultiDiscrete, MultiBinary, Dict and Tuple are); wrap it with gymnasium.wrappers.FlattenObservation"
        )
