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

from corral.envs.base import EnvError
from corral.envs.group import EnvGroup
from corral.envs.host import HostVecEnv, tree_to_numpy, tree_to_torch
from corral.envs.make import EnvFactory, check_env
from corral.envs.spaces import flatten_parts

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
                    obs[lo:hi], rew[lo:hi], ended = group.step(act[lo:hi].copy(), arg)
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


class WorkerDied(EnvError):
    """A worker process ended without a reply (killed, crashed in native code)."""

    def __init__(self, message: str, worker: int):
        super().__init__(message)
        self.worker = worker


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

    Same semantics and options as :class:`~corral.envs.sync.SyncVecEnv`; its
    ``state_dict`` has the same layout, so a checkpoint moves between the two.
    ``start_method``: ``"fork"`` (default on Linux: starts in milliseconds),
    ``"forkserver"`` or ``"spawn"`` (each worker imports corral again).
    """

    _discrete_as_array = True

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
        self._ctx, self._start_method, self._payload = ctx, start_method, payload
        self._on_error, self._max_restarts = on_error, max_restarts
        self._procs: list = []
        self._conns: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
        for k in range(workers):
            p, conn = self._start(k)
            self._procs.append(p)
            self._conns.append(conn)
        ready = self._gather()
        self.copyable = all(ready)
        self._restarts = [0] * workers  # env rebuilds inside each live worker (it reports them)
        self._revived = [0] * workers  # times each worker process was started again after dying
        self._lost = 0  # env rebuilds counted by workers that died since
        self._reset_seed: int | None = None
        self._last_obs: np.ndarray | None = None
        self._closed = False

    def _start(self, k: int):
        """Start worker process ``k`` (its slice of envs); its first reply is its readiness."""
        offset, count = self.slices[k]
        parent_conn, child_conn = self._ctx.Pipe()
        p = self._ctx.Process(
            target=_worker,
            args=(child_conn, parent_conn if self._start_method == "fork" else None, self._payload, offset, count,
                  self.env_id, self._on_error, self._max_restarts, self._specs),
            daemon=True,
            name=f"corral-env-{offset}",
        )
        p.start()
        child_conn.close()
        return p, parent_conn

    def _revive(self, k: int, err: "WorkerDied") -> list:
        """``on_error=restart``: a new process for dead worker ``k``, fresh episodes in its
        envs; returns the step's ``ended`` entries that drop their unfinished episodes."""
        lo, count = self.slices[k]
        self._revived[k] += 1
        if self._revived[k] > self._max_restarts:
            raise EnvError(f"{err}; giving up after {self._max_restarts} restarts of this worker "
                           "(raise env.max_restarts, or fix the env)") from None
        self._conns[k].close()
        self._lost += self._restarts[k] + count
        self._restarts[k] = 0
        self._procs[k], self._conns[k] = self._start(k)
        self._recv(k)  # ready
        seed = None
        if self._reset_seed is not None:  # deterministic, and distinct from every other env's seed
            seed = int(np.random.SeedSequence([self._reset_seed, lo, self._revived[k]]).generate_state(1)[0]) - lo
        self._conns[k].send(("reset", seed))
        self._recv(k)
        b = self._buf
        b["rew"][lo:lo + count] = 0.0
        self._restart_messages.append(
            f"{err}; started a new one and dropped the unfinished episodes of its {count} envs "
            f"(restart {self._revived[k]} of this worker)")
        last = self._last_obs
        return [(i, False, True, (last[i] if last is not None else b["obs"][i]).copy(), None)
                for i in range(lo, lo + count)]

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    @property
    def restarts(self) -> int:
        """Envs rebuilt: by live workers, plus every env of a worker process that died."""
        return sum(self._restarts) + self._lost

    def _recv(self, k: int):
        try:
            status, value = self._conns[k].recv()
        except (EOFError, ConnectionResetError, OSError):
            p = self._procs[k]
            p.join(timeout=1)
            lo, count = self.slices[k]
            raise WorkerDied(
                f"env {self.env_id!r}: worker process {k} (env indices {lo}..{lo + count - 1}) died "
                f"(exit code {p.exitcode}) at vector step {self.steps}", k
            ) from None
        if status == "error":
            msg, blob, text = value
            cause = pickle.loads(blob)
            if hasattr(cause, "add_note"):
                cause.add_note(f"in worker process {k}:\n{text}")
            raise EnvError(msg) from cause
        return value

    def _gather(self, cmd: str | None = None, arg: Any = None, per_worker: list | None = None,
                dead: list | None = None) -> list:
        """Send ``cmd`` to every worker and collect the replies in order. Workers that died
        go into ``dead`` (their reply is None) when it is given; otherwise the first error raises."""
        if cmd is not None:
            for k, c in enumerate(self._conns):
                try:
                    c.send((cmd, per_worker[k] if per_worker is not None else arg))
                except (OSError, ValueError):  # a dead worker's pipe; its recv says so
                    pass
        out, first_error = [], None
        for k in range(len(self._conns)):
            try:
                out.append(self._recv(k))
            except WorkerDied as e:
                if dead is None:
                    first_error = first_error or e
                else:
                    dead.append(e)
                out.append(None)
            except EnvError as e:  # drain the others first, so the pipes stay in step
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return out

    def _reset_arrays(self, seed):
        self._reset_seed = seed
        self._gather("reset", seed)
        self._last_obs = self._buf["obs"].copy()
        return self._last_obs

    def _step(self, acts):
        b = self._buf
        b["act"][:] = acts
        dead: list = []
        replies = self._gather("step", self.steps, dead=dead if self._on_error == "restart" else None)
        for k, reply in enumerate(replies):
            if reply is not None:
                self._restarts[k], messages = reply
                self._restart_messages.extend(messages)
        revived = []
        for err in dead:  # a process that died (a segfault, the OOM killer): a new one, fresh episodes
            revived += self._revive(err.worker, err)
        obs, rew = b["obs"].copy(), b["rew"].copy()
        self._last_obs = obs
        term, trunc, ep_done = b["term"], b["trunc"], b["ep_done"]
        if not (revived or term.any() or trunc.any()):
            return obs, rew, []
        ret, length = b["ep_ret"], b["ep_len"]
        gone = {i for i, *_ in revived}
        return obs, rew, sorted(revived + [(int(i), bool(term[i]), bool(trunc[i]), b["final"][i].copy(),
                                  (float(ret[i]), int(length[i])) if ep_done[i] else None)
                                 for i in np.nonzero(term | trunc)[0] if int(i) not in gone], key=lambda e: e[0])

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
