"""Subprocess backend: worker processes each step a slice of the envs.

Each worker runs an :class:`~corral.envs.group.EnvGroup` over its slice, the same code
``SyncVecEnv`` runs in-process, so autoreset, final observations, episode statistics,
restarts and env state capture are the same bit for bit. Actions and results travel
through shared memory allocated once (``multiprocessing`` raw arrays); the pipes carry
only a command and a short reply per step.

Env factories travel as the spec string where the user named one (a worker resolves
``module:callable`` and ``file.py:Class`` itself) and pickled with cloudpickle
otherwise, so lambdas and classes defined in a script or notebook work.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import torch

from corral.envs.spaces import flatten_parts
from corral.envs.base import EnvError
from corral.envs.group import EnvGroup
from corral.envs.make import EnvFactory, check_env
from corral.envs.vector import HostVecEnv, tree_to_numpy, tree_to_torch

_CTYPES = {"float32": "f", "float64": "d", "uint8": "B", "int8": "b", "int16": "h", "uint16": "H",
           "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "bool": "B"}


def _raw(ctx, dtype: np.dtype, shape: tuple[int, ...]):
    n = int(np.prod(shape, dtype=np.int64))
    return ctx.RawArray(_CTYPES[np.dtype(dtype).name], max(n, 1)), np.dtype(dtype), shape


def _view(spec) -> np.ndarray:
    raw, dtype, shape = spec
    n = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(raw, dtype=dtype, count=n).reshape(shape)


def _pack_exception(e: BaseException) -> tuple[str, Any, str]:
    """What travels back when a worker fails: message, the original cause, its traceback."""
    cause = e.__cause__ if isinstance(e, EnvError) and e.__cause__ is not None else e
    text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    try:
        blob = pickle.dumps(cause)
        pickle.loads(blob)
    except Exception:
        blob = pickle.dumps(RuntimeError(f"{type(cause).__name__}: {cause}"))
    msg = str(e) if isinstance(e, EnvError) else f"{type(e).__name__}: {e}"
    return msg, blob, text


def _worker(conn, parent_conn, payload, offset: int, count: int, env_id: str, on_error: str, max_restarts: int,
            bufs: dict) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    if parent_conn is not None:
        parent_conn.close()
    try:
        factory = cloudpickle.loads(payload) if isinstance(payload, bytes) else payload
        group = EnvGroup([factory] * count, env_id, offset, on_error, max_restarts)
        conn.send(("ok", group.copyable))
    except BaseException as e:
        conn.send(("error", _pack_exception(e)))
        conn.close()
        return
    v = {k: _view(s) for k, s in bufs.items()}
    lo, hi = offset, offset + count
    obs, final, act = v["obs"], v["final"], v["act"]
    rew, term, trunc = v["rew"], v["term"], v["trunc"]
    ep_ret, ep_len, ep_done = v["ep_ret"], v["ep_len"], v["ep_done"]
    try:
        while True:
            try:
                cmd, arg = conn.recv()
            except EOFError:  # the parent went away
                break
            try:
                if cmd == "step":
                    ended = group.step(act[lo:hi].copy(), arg, obs[lo:hi], rew[lo:hi])
                    term[lo:hi] = False
                    trunc[lo:hi] = False
                    ep_done[lo:hi] = False
                    for i, terminated, truncated, final_obs, episode in ended:
                        term[lo + i], trunc[lo + i], final[lo + i] = terminated, truncated, final_obs
                        if episode is not None:
                            (ep_ret[lo + i], ep_len[lo + i]), ep_done[lo + i] = episode, True
                    conn.send(("ok", (group.restarts, group.messages)))
                    group.messages = []
                elif cmd == "reset":
                    obs[lo:hi] = group.reset(arg)
                    conn.send(("ok", None))
                elif cmd == "get_state":
                    conn.send(("ok", group.get_state()))
                elif cmd == "set_state":
                    conn.send(("ok", group.set_state(arg)))
                elif cmd == "close":
                    group.close()
                    conn.send(("ok", None))
                    break
                else:
                    raise ValueError(f"unknown command {cmd!r}")
            except Exception as e:
                conn.send(("error", _pack_exception(e)))
    finally:
        conn.close()


def _shutdown(procs: list, conns: list) -> None:
    """Close workers: ask, wait a little, then terminate. Runs at close() or at exit."""
    for c in conns:
        try:
            c.send(("close", None))
        except (OSError, ValueError):
            pass
    for c in conns:
        try:
            if c.poll(5):
                c.recv()
        except (OSError, EOFError, ValueError):
            pass
        c.close()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)


class SubprocVecEnv(HostVecEnv):
    """N envs in ``num_workers`` worker processes (default: one per CPU core, at most N).

    Same semantics and options as :class:`~corral.envs.vector.SyncVecEnv`; its
    ``state_dict`` has the same layout, so a checkpoint moves between the two.
    ``start_method``: ``"fork"`` (default on Linux: starts in milliseconds),
    ``"forkserver"`` or ``"spawn"`` (each worker imports corral again).
    """

    def __init__(
        self,
        factories: EnvFactory | Sequence[EnvFactory],
        num_envs: int | None = None,
        env_id: str = "env",
        device: str | torch.device = "cpu",
        num_workers: int | None = None,
        start_method: str | None = None,
        check_finite: bool = True,
        strict: bool = False,
        on_error: str = "raise",
        max_restarts: int = 100,
    ):
        if callable(factories) and not isinstance(factories, (list, tuple)):
            if num_envs is None:
                raise ValueError("SubprocVecEnv(factory, num_envs): give num_envs with a single factory")
            factories = [factories] * num_envs
        factories = list(factories)
        n = len(factories)
        if any(f is not factories[0] for f in factories):
            raise ValueError("SubprocVecEnv takes one factory for all envs (or the same one repeated)")
        factory: Callable[[], gym.Env] = factories[0]
        # One env here for the spaces (and the user's errors, raised where they can be read).
        probe = flatten_parts(factory())
        try:
            check_env(probe, env_id)
            obs_space, act_space = probe.observation_space, probe.action_space
        finally:
            probe.close()
        self._init_front(n, obs_space, act_space, env_id, device, check_finite, strict)
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        ctx = mp.get_context(start_method)
        workers = max(1, min(n, num_workers or os.cpu_count() or 1))
        sizes = [n // workers + (1 if k < n % workers else 0) for k in range(workers)]
        self.slices = [(sum(sizes[:k]), sizes[k]) for k in range(workers)]
        act_dtype = np.int64 if self._discrete else act_space.dtype
        specs = {
            "obs": _raw(ctx, self._obs_dtype, (n, *obs_space.shape)),
            "final": _raw(ctx, self._obs_dtype, (n, *obs_space.shape)),
            "act": _raw(ctx, act_dtype, (n,) if self._discrete else (n, *act_space.shape)),
            "rew": _raw(ctx, np.float32, (n,)),
            "term": _raw(ctx, np.bool_, (n,)),
            "trunc": _raw(ctx, np.bool_, (n,)),
            "ep_ret": _raw(ctx, np.float32, (n,)),
            "ep_len": _raw(ctx, np.int64, (n,)),
            "ep_done": _raw(ctx, np.bool_, (n,)),
        }
        self._specs = specs
        self._buf = {k: _view(s) for k, s in specs.items()}
        try:
            payload: Any = cloudpickle.dumps(factory)
        except Exception:
            if start_method != "fork":
                raise
            payload = factory  # a fork child inherits it as it is
        self._procs: list = []
        self._conns: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
        for offset, count in self.slices:
            parent_conn, child_conn = ctx.Pipe()
            p = ctx.Process(
                target=_worker,
                args=(child_conn, parent_conn if start_method == "fork" else None, payload, offset, count, env_id,
                      on_error, max_restarts, specs),
                daemon=True,
                name=f"corral-env-{offset}",
            )
            p.start()
            child_conn.close()
            self._procs.append(p)
            self._conns.append(parent_conn)
        ready = self._gather()
        self.copyable = all(ready)
        self._restarts = [0] * workers
        self._closed = False

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    @property
    def restarts(self) -> int:
        return sum(self._restarts)

    def _recv(self, k: int):
        try:
            status, value = self._conns[k].recv()
        except (EOFError, ConnectionResetError, OSError):
            p = self._procs[k]
            p.join(timeout=1)
            lo, count = self.slices[k]
            raise EnvError(
                f"env {self.env_id!r}: worker process {k} (env indices {lo}..{lo + count - 1}) died "
                f"(exit code {p.exitcode}) at vector step {self.steps}"
            ) from None
        if status == "error":
            msg, blob, text = value
            cause = pickle.loads(blob)
            if hasattr(cause, "add_note"):
                cause.add_note(f"in worker process {k}:\n{text}")
            raise EnvError(msg) from cause
        return value

    def _gather(self, cmd: str | None = None, arg: Any = None, per_worker: list | None = None) -> list:
        if cmd is not None:
            for k, c in enumerate(self._conns):
                c.send((cmd, per_worker[k] if per_worker is not None else arg))
        out, first_error = [], None
        for k in range(len(self._conns)):
            try:
                out.append(self._recv(k))
            except EnvError as e:  # drain the others first, so the pipes stay in step
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return out

    def _reset_arrays(self, seed):
        self._gather("reset", seed)
        return self._buf["obs"].copy()

    def _step_into(self, acts, obs, rew):
        b = self._buf
        b["act"][:] = acts
        replies = self._gather("step", self.steps)
        for k, (restarts, messages) in enumerate(replies):
            self._restarts[k] = restarts
            self._restart_messages.extend(messages)
        obs[...] = b["obs"]
        rew[:] = b["rew"]
        term, trunc, ep_done = b["term"], b["trunc"], b["ep_done"]
        if not (term.any() or trunc.any()):
            return []
        ret, length = b["ep_ret"], b["ep_len"]
        return [(int(i), bool(term[i]), bool(trunc[i]), b["final"][i].copy(),
                 (float(ret[i]), int(length[i])) if ep_done[i] else None)
                for i in np.nonzero(term | trunc)[0]]

    def state_dict(self) -> dict[str, Any]:
        parts = self._gather("get_state")
        state: dict[str, Any] = {
            "copyable": self.copyable,
            "steps": self.steps,
            "ep_ret": np.concatenate([p["ep_ret"] for p in parts]),
            "ep_len": np.concatenate([p["ep_len"] for p in parts]),
        }
        if self.copyable:
            state["envs"] = [s for p in parts for s in p["envs"]]
        return tree_to_torch(state)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns True when env internals were restored (episodes continue)."""
        self.steps = int(state.get("steps", 0))
        if not (state.get("copyable") and self.copyable and len(state.get("envs", ())) == self.num_envs):
            return False
        s = tree_to_numpy(state)
        per_worker = [
            {"ep_ret": s["ep_ret"][lo:lo + c], "ep_len": s["ep_len"][lo:lo + c], "envs": s["envs"][lo:lo + c]}
            for lo, c in self.slices
        ]
        return all(self._gather("set_state", per_worker=per_worker))

    def close(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._finalizer()
