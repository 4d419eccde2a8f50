"""Native torch-batched envs: Gymnasium's classic-control tasks as tensor physics over N envs.

``make_native("CartPole-v1", 65536, device="cuda")`` gives a VecEnv (see
:mod:`corral.envs.base`) whose whole batch steps in a few tensor ops on the device,
with Gymnasium 1.4's dynamics, rewards, time limits and initial-state distributions.
Ids may carry the ``native:`` prefix that ``make_vec_env`` routes on.
"""

from __future__ import annotations

import difflib

import torch

from corral.envs.deepsea import SIZES as DEEPSEA_SIZES
from corral.envs.native.classic import Acrobot, CartPole, CartPoleNoVel, MountainCar, MountainCarContinuous, Pendulum
from corral.envs.native.core import NativeVecEnv
from corral.envs.native.deepsea import DeepSea
from corral.errors import UserError

_CLASSES: dict[str, type[NativeVecEnv]] = {
    cls.gym_id: cls for cls in (CartPole, CartPoleNoVel, Acrobot, MountainCar, MountainCarContinuous, Pendulum)
}

NATIVE_ENVS: tuple[str, ...] = tuple(_CLASSES)
"""Gymnasium ids with a native implementation (each also accepted as ``native:<id>``)."""

DEEPSEA_ENVS: dict[str, int] = {f"DeepSea{n}-v0": n for n in DEEPSEA_SIZES}
"""Native DeepSea ids (``corral.envs.native.deepsea``) and their sizes: Gymnasium's ``DeepSea<N>-v0``."""


class UnknownNativeEnvError(UserError, ValueError):
    """An id with no native implementation; a ValueError, and a UserError for the CLI."""


def make_native(
    env_id: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> NativeVecEnv:
    """Build ``num_envs`` copies of ``env_id`` ("CartPole-v1" or "native:CartPole-v1") on ``device``."""
    name = env_id.removeprefix("native:")
    if name in DEEPSEA_ENVS:  # one class, sized by the id
        return DeepSea(num_envs, device=device, seed=seed, dtype=dtype, size=DEEPSEA_ENVS[name])
    cls = _CLASSES.get(name)
    if cls is None:
        lowered = {k.lower(): k for k in NATIVE_ENVS}
        close = [lowered[k] for k in difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)]
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownNativeEnvError(
            f"no native env {env_id!r}; {hint}native envs: {', '.join(NATIVE_ENVS)}, DeepSea<N>-v0 for N in "
            f"{', '.join(str(n) for n in DEEPSEA_SIZES)} "
            "(other Gymnasium ids run on the 'sync' backend)"
        )
    return cls(num_envs, device=device, seed=seed, dtype=dtype)


__all__ = [
    "NATIVE_ENVS",
    "DEEPSEA_ENVS",
    "Acrobot",
    "CartPole",
    "DeepSea",
    "MountainCar",
    "MountainCarContinuous",
    "NativeVecEnv",
    "Pendulum",
    "UnknownNativeEnvError",
    "make_native",
]
