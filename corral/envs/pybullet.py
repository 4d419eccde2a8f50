"""PyBullet's locomotion and control envs (``HalfCheetahBulletEnv-v0``, ``AntBulletEnv-v0``, ...)
through the maintained Gymnasium port, ``pybullet-envs-gymnasium`` (``pip install
'corral[pybullet]'``).

The ids are registered lazily: the first time a run names one, :func:`register_pybullet`
imports the port (which registers them with Gymnasium), so no ``--import`` is needed.

PyBullet's C library writes to the process's file descriptors, below Python's ``sys.stdout``:
``pybullet build time: ...`` when the module is imported and ``argv[0]=`` lines each time an
env connects to its physics server (its first ``reset``). :func:`quiet_fds` points the
descriptors at ``/dev/null`` around those two moments and restores them, so ``corral train
... --json`` still prints only its JSON line. Everything else the library and the env say
(errors included) reaches the console as before."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import re
import sys
from collections.abc import Iterator

import gymnasium as gym

from corral.errors import UserError

PACKAGE = "pybullet_envs_gymnasium"
EXTRA = "pybullet"
INSTALL = f"pip install 'corral[{EXTRA}]'"

# The ids pybullet-envs-gymnasium 0.6 registers (close matches for a typo before it is imported).
KNOWN_IDS = (
    "HalfCheetahBulletEnv-v0", "AntBulletEnv-v0", "HopperBulletEnv-v0", "Walker2DBulletEnv-v0",
    "HumanoidBulletEnv-v0", "HumanoidFlagrunBulletEnv-v0", "HumanoidFlagrunHarderBulletEnv-v0",
    "InvertedPendulumBulletEnv-v0", "InvertedDoublePendulumBulletEnv-v0",
    "InvertedPendulumSwingupBulletEnv-v0", "ReacherBulletEnv-v0", "PusherBulletEnv-v0", "ThrowerBulletEnv-v0",
)
_ID_PATTERN = re.compile(r"[A-Za-z0-9]+BulletEnv-v\d+")

_libc = None


def is_bullet_name(env_id: str) -> bool:
    """Whether ``env_id`` reads as a PyBullet env id (``...BulletEnv-vN``), registered or not."""
    return _ID_PATTERN.fullmatch(env_id) is not None


def is_bullet_id(env_id: str) -> bool:
    """Whether ``env_id`` is registered by pybullet-envs-gymnasium."""
    spec = gym.registry.get(env_id)
    if spec is None:
        return False
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    return entry.startswith(PACKAGE)


def _flush_c_stdio() -> None:
    """fflush(NULL): C-level buffered output goes where its descriptor points now."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError):  # no libc to load (not expected on Linux or macOS)
        pass


@contextlib.contextmanager
def quiet_fds(*fds: int) -> Iterator[None]:
    """Point file descriptors ``fds`` (default: 1, stdout) at ``/dev/null`` for the block, at the
    C level, and restore them after it (also when it raises). Python's own buffers are flushed
    first, and C stdio's before each switch, so nothing written before the block is lost and
    nothing the C code buffered inside it leaks out later."""
    fds = fds or (1,)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _flush_c_stdio()
    saved: list[tuple[int, int]] = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            try:
                saved.append((fd, os.dup(fd)))
            except OSError:  # the descriptor is closed: nothing to silence
                continue
            os.dup2(devnull, fd)
        yield
    finally:
        _flush_c_stdio()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def register_pybullet(env_id: str | None = None) -> None:
    """Import pybullet-envs-gymnasium (registering its ids) and PyBullet itself with their
    console messages silenced. Without the package: a UserError naming the extra to install
    (``env_id`` names the env in it)."""
    if sys.modules.get(PACKAGE) is not None and sys.modules.get("pybullet") is not None:
        return
    what = f"env {env_id!r} is a PyBullet env and needs" if env_id else "PyBullet envs need"
    try:
        with quiet_fds(1, 2):  # "pybullet build time: ..." is printed when pybullet loads
            importlib.import_module(PACKAGE)
            importlib.import_module("pybullet")
    except ImportError as e:
        raise UserError(f"{what} pybullet-envs-gymnasium, which is not installed: {INSTALL} ({e})") from None


class QuietBullet(gym.Wrapper):
    """A PyBullet env whose connection to its physics server (made on the first ``reset``, and
    again after ``close``) keeps the C library's ``argv[0]=`` lines off stdout."""

    def reset(self, **kwargs):
        if getattr(self.env.unwrapped, "physicsClientId", 0) < 0:  # this reset connects
            with quiet_fds(1):
                return self.env.reset(**kwargs)
        return self.env.reset(**kwargs)


def silence_bullet(env: gym.Env) -> gym.Env:
    """``env`` wrapped so that its connects print nothing on stdout (see :class:`QuietBullet`);
    for env factories of your own that call ``gymnasium.make`` on a Bullet id."""
    return QuietBullet(env)
