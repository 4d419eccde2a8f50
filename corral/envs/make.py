"""Turning what a user names into env factories: Gymnasium ids, ``module:callable``,
``path/to/file.py:Name``, names registered with :func:`register`, ``gymnasium.Env``
classes and instances. Errors here are user errors with a fix in the message."""

from __future__ import annotations

import copy
import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from corral.errors import UserError

EnvFactory = Callable[[], gym.Env]

_REGISTRY: dict[str, Callable[..., gym.Env]] = {}

# Which extra brings the package an env family needs, keyed by entry-point module prefix.
_EXTRAS = {
    "gymnasium.envs.box2d": "box2d",
    "gymnasium.envs.mujoco": "mujoco",
    "ale_py": "atari",
    "shimmy": "atari",
}


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


def _load_attr(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = os.path.abspath(target)
        if not os.path.exists(path):
            raise UserError(f"env {spec!r}: file {target!r} does not exist")
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
                f"env {spec!r}: cannot import module {target!r} ({e}); make sure it is on PYTHONPATH "
                "or give a file path like path/to/file.py:ClassName"
            ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"env {spec!r}: {target!r} has no attribute {attr!r}{hint}") from None


def _missing_extra_hint(env_id: str) -> str:
    entry = gym.registry[env_id].entry_point
    entry = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    for prefix, extra in _EXTRAS.items():
        if entry.startswith(prefix):
            return f"pip install 'corral[{extra}]'"
    return "install the package that provides it"


def _gym_factory(env_id: str, kwargs: dict) -> EnvFactory:
    if env_id not in gym.registry:
        # Atari and other plugin families register on import.
        if env_id.startswith("ALE/"):
            try:
                import ale_py  # noqa: F401

                gym.register_envs(ale_py)
            except ImportError:
                raise UserError(f"env {env_id!r} needs ale-py: pip install 'corral[atari]'") from None
    if env_id not in gym.registry:
        known = list(gym.registry.keys()) + list(_REGISTRY)
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `corral list` shows the env families"
        raise UserError(f"unknown env {env_id!r}{hint}")

    def factory() -> gym.Env:
        try:
            return gym.make(env_id, **kwargs)
        except gym.error.DependencyNotInstalled as e:
            raise UserError(f"env {env_id!r} needs a package that is not installed: {_missing_extra_hint(env_id)} ({e})") from None
        except TypeError as e:
            raise UserError(f"env {env_id!r} rejected its kwargs {kwargs}: {e}") from None

    return factory


def make_factory(spec: Any, kwargs: dict | None = None) -> EnvFactory:
    """Return a zero-argument callable building one fresh env for ``spec``."""
    kwargs = dict(kwargs or {})
    if isinstance(spec, gym.Env):
        if kwargs:
            raise UserError("env kwargs cannot be applied to an env instance; pass its class or a factory")
        template = spec
        return lambda: copy.deepcopy(template)
    if isinstance(spec, type) and issubclass(spec, gym.Env):
        return lambda: spec(**kwargs)
    if callable(spec) and not isinstance(spec, str):
        return lambda: spec(**kwargs)
    if not isinstance(spec, str):
        raise UserError(f"cannot make an env from {spec!r}: give an id, 'module:callable', a gymnasium.Env or a class")
    if spec in _REGISTRY:
        fn = _REGISTRY[spec]
        return lambda: fn(**kwargs)
    if ":" in spec and not spec.startswith("native:"):
        target = spec.rpartition(":")[0]
        # "module:EnvId-v0" is also Gymnasium's own import-then-make syntax.
        obj = _load_attr(spec) if target.endswith(".py") or not _is_gym_namespace_id(spec) else None
        if obj is not None:
            if isinstance(obj, gym.Env):
                return make_factory(obj, kwargs)
            if not callable(obj):
                raise UserError(f"env {spec!r} names {type(obj).__name__}, which is not callable")
            return lambda: obj(**kwargs)
    return _gym_factory(spec, kwargs)


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

    if not isinstance(env.action_space, (spaces.Discrete, spaces.Box)):
        raise UserError(
            f"env {name!r}: action space {env.action_space} is not supported yet (Discrete or Box are)"
        )
    if not isinstance(env.observation_space, spaces.Box):
        raise UserError(
            f"env {name!r}: observation space {env.observation_space} is not supported yet (Box is); "
            "wrap it with gymnasium.wrappers.FlattenObservation"
        )
