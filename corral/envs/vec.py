"""``make_vec_env``: one entry point over every vector backend.

It sits above the backends (each imports only the front end in :mod:`corral.envs.host`
and the env resolution in :mod:`corral.envs.make`), so choosing one is a plain import
of all of them; the optional ones (EnvPool) import their package only when built.
"""

from __future__ import annotations

from typing import Any

import torch

from corral.envs.envpool_backend import EnvPoolVecEnv
from corral.envs.host import HostVecEnv
from corral.envs.make import env_name, make_factory
from corral.envs.native import make_native
from corral.envs.subproc import SubprocVecEnv
from corral.envs.sync import SyncVecEnv
from corral.errors import UserError

BACKENDS = ("sync", "subproc", "envpool", "native")


def make_vec_env(
    spec: Any,
    num_envs: int,
    kwargs: dict | None = None,
    device: str | torch.device = "cpu",
    backend: str = "sync",
    *,
    atari_wrappers: Any = True,
    strict: bool = False,
    on_error: str = "raise",
    max_restarts: int = 100,
    num_workers: int | None = None,
    check_finite: bool = True,
    max_episode_steps: int | None = None,
    wrappers: list | None = None,
    mask_obs: tuple[int, ...] | None = None,
    multi_agent: bool | None = None,
    opponents: tuple[str, ...] = (),
    pixels: dict | None = None,
) -> HostVecEnv:
    """Build N envs for ``spec`` on ``backend``; the one entry point every caller uses.

    ``backend``: ``"sync"`` (in this process), ``"subproc"`` (worker processes, each
    stepping a slice of the envs; ``num_workers`` of them, default one per CPU core up
    to N), ``"envpool"`` (EnvPool's C++ thread pool, for the ids it knows) or
    ``"native"`` (torch-batched classic control). Every backend follows
    :mod:`corral.envs.base`.

    ``atari_wrappers``: for ALE ids, ``True`` applies the training preprocessing (no-op
    reset, frame skip 4 with max-pool, 84x84 gray, frame stack 4, episodic life, reward
    clipping, fire on reset), ``"eval"`` the same without episodic life and clipping,
    a dict overrides single options (see :class:`corral.envs.atari.AtariOptions`),
    ``False`` none. ``info["episode_return"]`` is always the raw game score.

    ``strict``: reject out-of-bounds Box actions (default: clip them and count them in
    ``env.out_of_bounds_actions``). ``on_error``: ``"raise"`` or ``"restart"`` an env that
    raises (at most ``max_restarts`` times per env; counted in ``env.restarts``).

    ``max_episode_steps``: truncate episodes after this many agent steps (None: the env's own
    limit; Atari's is 108,000 frames). Native envs keep their built-in limit and refuse one.

    ``wrappers``: Gymnasium wrappers around each env by import path (``corral.envs.wrapped``).

    ``mask_obs``: observation entries to zero (``corral.envs.masked``), for Box observations.

    ``multi_agent``: build a :class:`corral.envs.multiagent.MultiAgentVecEnv` (PettingZoo envs,
    an agent dimension); None decides from ``spec`` (``mpe:`` / ``pettingzoo:`` ids, PettingZoo
    instances and classes); multi-agent algorithms pass True (a ``module:callable`` then
    returns a PettingZoo env). ``pixels``: how a multi-agent env's image observations are
    preprocessed (``corral.envs.ma_pixels``).
    """
    if num_envs < 1:
        raise UserError(f"env.num_envs must be >= 1, got {num_envs}")
    if on_error not in ("raise", "restart"):
        raise UserError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
    name = env_name(spec)
    from corral.envs.multiagent import is_multiagent_spec, make_multiagent_vec_env

    if multi_agent or (multi_agent is None and is_multiagent_spec(spec)):
        _check_multi_agent_options(name, mask_obs=mask_obs, wrappers=wrappers)
        return make_multiagent_vec_env(spec, num_envs, kwargs, device, backend, max_episode_steps=max_episode_steps,
                                       check_finite=check_finite, opponents=opponents, pixels=pixels)
    _check_single_agent_options(spec, name, backend, opponents=opponents, pixels=pixels, mask_obs=mask_obs,
                                wrappers=wrappers)
    if isinstance(spec, str) and (spec.startswith("native:") or backend == "native"):
        return _native(spec, name, num_envs, device, max_episode_steps)
    if backend == "envpool":
        if max_episode_steps is not None:  # EnvPool's own option, in agent steps
            kwargs = {**(kwargs or {}), "max_episode_steps": int(max_episode_steps)}
        return EnvPoolVecEnv(spec, num_envs, kwargs, device=device, atari_wrappers=atari_wrappers, strict=strict,
                             check_finite=check_finite)
    if backend not in ("sync", "subproc"):
        raise UserError(f"unknown env backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    factory = _host_factory(spec, kwargs, atari_wrappers=atari_wrappers, max_episode_steps=max_episode_steps,
                            mask_obs=mask_obs, wrappers=wrappers)
    if backend == "subproc":
        return SubprocVecEnv(factory, num_envs, env_id=name, device=device, num_workers=num_workers, strict=strict,
                             on_error=on_error, max_restarts=max_restarts, check_finite=check_finite)
    return SyncVecEnv([factory] * num_envs, env_id=name, device=device, check_finite=check_finite, strict=strict,
                      on_error=on_error, max_restarts=max_restarts)


def _check_multi_agent_options(name: str, *, mask_obs: tuple[int, ...] | None, wrappers: list | None) -> None:
    if mask_obs:
        raise UserError(f"env.mask_obs applies to single-agent envs, not the multi-agent {name!r}")
    if wrappers:
        raise UserError(f"env.wrappers wrap single-agent envs, not the multi-agent {name!r}: leave it empty")


def _native(spec: str, name: str, num_envs: int, device: str | torch.device,
            max_episode_steps: int | None) -> HostVecEnv:
    if max_episode_steps is not None:
        raise UserError(f"env {name!r}: native envs keep their built-in episode limit; an episode cap "
                        f"({max_episode_steps} steps) is not applied to them: leave it unset (None)")
    return make_native(spec, num_envs, device=device)


def _check_single_agent_options(spec: Any, name: str, backend: str, *, opponents: tuple[str, ...],
                                pixels: dict | None, mask_obs: tuple[int, ...] | None, wrappers: list | None) -> None:
    """Refuse the options a single-agent env on ``backend`` cannot take, naming each and the fix."""
    if opponents:
        raise UserError(f"env.opponents applies to multi-agent envs, not the single-agent {name!r}: leave it unset")
    if pixels:
        raise UserError(f"env.pixels applies to multi-agent envs, not the single-agent {name!r} (Atari's "
                        "preprocessing is env.atari_wrappers): leave it unset")
    if mask_obs and (backend in ("native", "envpool") or (isinstance(spec, str) and spec.startswith("native:"))):
        raise UserError(f"env.mask_obs applies to sync and subproc envs, not the {backend} backend of {name!r}: "
                        "use env.backend=sync (or native:CartPoleNoVel-v1 for a masked native CartPole)")
    if wrappers and (backend in ("native", "envpool") or (isinstance(spec, str) and spec.startswith("native:"))):
        raise UserError(f"env.wrappers wrap sync and subproc envs, not the {backend} backend of {name!r}: "
                        "use env.backend=sync")


def _host_factory(spec: Any, kwargs: dict | None, *, atari_wrappers: Any, max_episode_steps: int | None,
                  mask_obs: tuple[int, ...] | None, wrappers: list | None) -> Any:
    """The factory the sync and subproc backends call per env: the resolved env, its observation
    mask (``corral.envs.masked``) and the user's wrappers (``corral.envs.wrapped``) around it."""
    factory = make_factory(spec, kwargs, atari_wrappers=atari_wrappers, max_episode_steps=max_episode_steps)
    if mask_obs:
        from corral.envs.masked import MaskedFactory

        factory = MaskedFactory(factory, mask_obs)
    if wrappers:
        from corral.envs.wrapped import WrappedFactory

        factory = WrappedFactory(factory, wrappers)
    return factory
