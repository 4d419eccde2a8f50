"""Breakout local search in C: ``maxcut_bls.c`` compiled on first use, driven through ctypes.

The numpy engine (:class:`~corral.problems.maxcut_bls.BreakoutSearch`) steps ``N`` searches
together at about 25 array operations a step; on a CPU those operations' overhead, not the
arithmetic, is most of the time. This engine runs the same search (the same phases, tabu rule,
adaptation and break-outs; see :mod:`corral.problems.maxcut_bls`) as a plain loop in C, one
search at a time for many steps per call, the ``N`` searches taking turns: 10-20x more moves a
CPU-second on Gset graphs. The C file is compiled with the system's C compiler (``$CC``, else
``cc``) into ``$CORRAL_CACHE`` (default ``~/.cache/corral``), once per version of the source;
without a compiler :func:`load_kernel` returns None and ``bls`` uses the numpy engine.

Break-outs and the elite are handled here, between calls: a search that stalled restarts from
the best assignment of all searches (even searches) or its own best (odd ones) with ``Lmax``
random flips.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from corral.problems.bls_common import RANDOM, _neighbours, tenure_ranges
from corral.problems.graphs import Graph

SOURCE = Path(__file__).with_name("maxcut_bls.c")
D_CUT, D_BEST, D_BEST_AT_LAST, D_PREV_CUT, D_PREV_FP, D_FP = range(6)
Q_STEP, Q_MODE, Q_LEFT, Q_JUMP, Q_OMEGA = range(5)
RAN_OUT, REACHED, BREAK_OUT = 0, 1, 2
_KERNEL: list = []  # [function or None], once loaded


def load_kernel():
    """The compiled ``bls_run`` (a ctypes function), or None where no C compiler works."""
    if _KERNEL:
        return _KERNEL[0]
    fn = None
    try:
        fn = _compile_and_load()
    except (OSError, subprocess.SubprocessError):
        fn = None
    _KERNEL.append(fn)
    return fn


def _compile_and_load():
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + platform.machine().encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CORRAL_CACHE", Path.home() / ".cache" / "corral"))
    lib = cache / f"maxcut_bls_{tag}.so"
    if not lib.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            subprocess.run([os.environ.get("CC", "cc"), "-O3", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"],
                           check=True, capture_output=True, timeout=120)
            os.replace(tmp, lib)  # atomic: a concurrent run sees the whole library or none
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    fn = ctypes.CDLL(str(lib)).bls_run
    p = ctypes.c_void_p
    fn.argtypes = [ctypes.c_int64] + [p] * 13 + [ctypes.c_int64, p]
    fn.restype = ctypes.c_int64
    return fn


def integral_weights(nbw: np.ndarray) -> bool:
    """True when the kernel's integer gains hold the graph exactly (integer weights, sums far
    from int32's range)."""
    return bool(np.all(nbw == np.rint(nbw))) and float(np.abs(nbw).sum()) < 2**30


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


class CompiledBreakoutSearch:
    """``N`` breakout local searches run by the C kernel; the settings and the interface
    (``run``, ``best``, ``moves``) of :class:`~corral.problems.maxcut_bls.BreakoutSearch`."""

    def __init__(self, graph: Graph, num_envs: int = 8, seed: int = 0, l0: int | None = None,
                 lmax: int | None = None, stall: int = 10000, p0: float = 0.8,
                 tenure: tuple[int, int] | None = None, start: torch.Tensor | None = None, chunk: int = 20000):
        self.fn = load_kernel()
        if self.fn is None:
            raise RuntimeError("the breakout local search kernel did not compile (no C compiler?)")
        self.n, self.N = n, N = graph.n, int(num_envs)
        self.rng = np.random.default_rng(seed)
        nbr, nbw = _neighbours(graph)
        real = nbw != 0
        self.ptr = np.concatenate([[0], np.cumsum(real.sum(1))]).astype(np.int64)
        self.adj = nbr[real].astype(np.int32)
        if not integral_weights(nbw):
            raise ValueError("the compiled breakout local search takes integer edge weights")
        self.w = nbw[real].astype(np.int32)
        self.nbr, self.nbw = nbr, nbw  # padded, for exact recomputation
        self.total_w = float(self.w.sum()) / 2
        wabs = np.abs(self.w)
        self.thr = 1e-6 * (float(wabs.max()) if wabs.size else 1.0)
        self.l0 = int(l0 or max(1, round(n / 100)))
        self.lmax = int(lmax or max(2, round(n / 10)))
        self.ip = np.zeros((N, 5), dtype=np.int64)  # per search: L0, Lmax, T, tenure range
        self.ip[:, :3] = [self.l0, self.lmax, int(stall)]
        self.ip[:, 3:] = tenure_ranges(n, N, tenure)
        self.p0 = float(p0)
        self.fkey = self.rng.random(n) + 0.5
        x = self.rng.random((N, n)) < 0.5 if start is None else \
            np.broadcast_to(torch.as_tensor(start).cpu().numpy() > 0, (N, n))
        self.s = np.where(x, 1, -1).astype(np.int8)
        self.gain = np.zeros((N, n), dtype=np.int32)
        self.expiry = np.zeros((N, n), dtype=np.int32)
        self.d = np.zeros((N, 6))
        self.q = np.zeros((N, 5), dtype=np.int64)
        self.q[:, Q_JUMP] = self.l0
        self.d[:, D_PREV_CUT] = math.nan
        for i in range(N):
            self._recompute(i)
        self.d[:, D_BEST] = self.d[:, D_BEST_AT_LAST] = self.d[:, D_CUT]
        self.best_s = self.s.copy()
        self.seeds = self.rng.integers(1, 2**63, N, dtype=np.uint64)
        self.chunk = int(chunk)
        self.moves = 0
        self._done = np.zeros(1, dtype=np.int64)

    def _recompute(self, i: int) -> None:
        """Search i's gains, cut and fingerprint from its spins (exact)."""
        s = self.s[i].astype(np.float64)
        self.gain[i] = np.rint(s * (s[self.nbr] * self.nbw).sum(-1)).astype(np.int32)
        self.d[i, D_CUT] = (self.total_w - self.gain[i].sum(dtype=np.float64) / 2) / 2
        self.d[i, D_FP] = s @ self.fkey

    def _break_out(self, i: int) -> None:
        j = i if i % 2 == 1 else int(self.d[:, D_BEST].argmax())
        self.s[i] = self.best_s[j]
        self._recompute(i)
        self.q[i, Q_OMEGA] = 0
        self.q[i, Q_MODE] = RANDOM
        self.q[i, Q_LEFT] = self.lmax
        self.d[i, D_PREV_CUT] = math.nan

    def _call(self, i: int, steps: int, stop_at: float) -> int:
        if self.q[i, Q_STEP] > 2**30:  # the kernel counts steps in int32: shift them down
            self.q[i, Q_STEP] -= 2**29
            np.maximum(self.expiry[i] - 2**29, 0, out=self.expiry[i])
        dp = np.array([self.p0, self.thr, stop_at])
        status = self.fn(self.n, _ptr(self.ptr), _ptr(self.adj), _ptr(self.w), _ptr(self.fkey), _ptr(self.s[i]),
                         _ptr(self.gain[i]), _ptr(self.expiry[i]), _ptr(self.best_s[i]), _ptr(self.d[i]),
                         _ptr(self.q[i]), _ptr(self.ip[i]), _ptr(dp), _ptr(self.seeds[i:i + 1]), steps,
                         _ptr(self._done))
        self.moves += int(self._done[0])
        return int(status)

    def best(self) -> tuple[float, torch.Tensor]:
        """The best cut of all searches and its 0/1 assignment (int8 ``[n]``)."""
        i = int(self.d[:, D_BEST].argmax())
        return float(self.d[i, D_BEST]), torch.from_numpy(self.best_s[i] > 0).to(torch.int8)

    def run(self, deadline: float, stop_at: float | None = None, on_best: Callable[[float], None] | None = None,
            on_tick: Callable[[], None] | None = None) -> None:
        """The searches take turns of ``chunk`` steps until ``deadline`` or until the best cut
        reaches ``stop_at`` (see :meth:`BreakoutSearch.run`)."""
        target = math.inf if stop_at is None else float(stop_at)
        top = float(self.d[:, D_BEST].max())
        if on_best is not None:
            on_best(top)
        next_tick = time.perf_counter() + 1.0
        while True:
            for i in range(self.N):
                left = self.chunk
                while left > 0:
                    status = self._call(i, left, target)
                    left -= int(self._done[0])
                    if status == BREAK_OUT:
                        self._break_out(i)
                    elif status == REACHED:
                        break
                if self.d[i, D_BEST] > top:
                    top = float(self.d[i, D_BEST])
                    if on_best is not None:
                        on_best(top)
                    if top >= target - self.thr:
                        return
                now = time.perf_counter()
                if now >= deadline:
                    return
                if now >= next_tick:
                    next_tick = now + 1.0
                    if on_tick is not None:
                        on_tick()


