"""Gymnasium wrappers named in the config (``env.wrappers``), applied to each env a factory makes.

Each item is a wrapper class by its import path, ``package.module.Class`` (or
``package.module:Class``), alone or as a one-key mapping to its keyword arguments, as rl-zoo's
``env_wrapper`` writes them::

    env:
      wrappers:
        - minigrid.wrappers.FlatObsWrapper
        - gymnasium.wrappers.TimeLimit: {max_episode_steps: 500}

They wrap the env innermost first, on top of ``gym.make`` (and its ``TimeLimit``), as
Stable-Baselines3's ``make_vec_env(wrapper_class=...)`` does. The factory keeps the names and
imports the classes where it is called, so worker processes build their own.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from corral.errors import UserError


def parse_wrappers(items: Any) -> list[tuple[str, dict]]:
    """``env.wrappers`` as ``[(path, kwargs), ...]``; a malformed item raises a ``UserError``."""
    if not isinstance(items, (list, tuple)):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item)), str):
            (path, kwargs), = item.items()
            if kwargs is not None and not isinstance(kwargs, dict):
                raise UserError(f"env.wrappers: the arguments of {path!r} must be a mapping, got {kwargs!r}")
            out.append((path, dict(kwargs or {})))
        else:
            raise UserError(f"env.wrappers: {item!r} is not a wrapper; write its import path "
                            "(package.module.Class), or {package.module.Class: {argument: value}}")
    return out


def resolve_wrapper(path: str) -> Any:
    """The class (or callable) at ``package.module.Class`` / ``package.module:Class``."""
    module, sep, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not name:
        raise UserError(f"env.wrappers: {path!r} is not an import path (package.module.Class)")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"env.wrappers: cannot import {module!r} for the wrapper {path!r} ({e}); install its "
                        "package or remove the wrapper") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UserError(f"env.wrappers: {module!r} has no {name!r} (the wrapper {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"env.wrappers: {path!r} is a {type(obj).__name__}, not a wrapper class")
    return obj


class WrappedFactory:
    """A picklable env factory whose envs are wrapped by ``wrappers`` (``env.wrappers``)."""

    def __init__(self, factory, wrappers: Any):
        self.factory, self.wrappers = factory, parse_wrappers(wrappers)
        self.max_episode_steps = getattr(factory, "max_episode_steps", None)
        for path, _ in self.wrappers:  # refuse a bad name before any env is made
            resolve_wrapper(path)

    def __call__(self) -> gym.Env:
        env = self.factory()
        for path, kwargs in self.wrappers:
            try:
                env = resolve_wrapper(path)(env, **kwargs)
            except TypeError as e:
                raise UserError(f"env.wrappers: {path}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                                f"failed: {e}") from None
        return env
