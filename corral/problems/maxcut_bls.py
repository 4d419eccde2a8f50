"""Breakout local search for MaxCut: ``N`` independent searches stepped together, in numpy.

After Benlic and Hao, "Breakout Local Search for the Max-Cut problem" (2013), written here from
the paper's description. Every search (one row of the ``[N, n]`` state) alternates two phases:

* **descent**: flip the node of largest positive gain until none is left (a one-flip local
  optimum);
* **perturbation** of ``L`` moves from that local optimum, of one of two kinds:
  *directed* (the best non-tabu flip, even when it lowers the cut; a tabu flip is taken when it
  beats the search's best cut, the aspiration rule) or *random* (uniform random nodes).

Every flipped node is tabu for a random number of steps (a fresh draw per flip) in ``[3, n / 10]``,
the paper's range, in odd searches and in ``[n / 20, n / 10]`` in even ones. At each local optimum
the search adapts:

* the jump magnitude ``L`` grows by one when the search came back to the local optimum it just
  left (same cut and same fingerprint), and returns to ``L0 = n / 100`` otherwise;
* ``omega`` counts the local optima since the search last improved its best cut; the directed
  kind is chosen with probability ``max(exp(-omega / T), P0)`` (``P0 = 0.8``), so a search that
  stalls perturbs more at random;
* after ``T`` local optima without improvement the search breaks out: it restarts from the best
  cut of all searches (the elite; every other search from its own best) and takes
  ``Lmax = n / 10`` random flips.

Where this departs from the paper's settings, measured on Gset (``docs/problems/maxcut.md``): with
the paper's ``T = 1000`` and tenure ``[3, n / 10]`` in every search, 8 searches left G14 at
3053-3063 and G22 at 13323 after 13-30 CPU-seconds; with ``T = 10000`` G22 reached 13359 but G14
stayed at 3058, which the longer tenure ``[n / 20, n / 10]`` took to 3064 (and G22 to 13358 only):
hence half the searches with each range.

Gains are kept incrementally: a flip updates the node and its neighbours only, so a step costs
a few passes over ``[N, n]`` to choose the moves and ``O(N * max_degree)`` to make them.

Two engines run this search: :class:`BreakoutSearch` below, ``N`` searches stepped together in
numpy (a step is about 25 array operations; torch's per-operation overhead on a CPU made it 5-10x
slower than numpy), and :class:`~corral.problems.maxcut_bls_kernel.CompiledBreakoutSearch`, the
same search as a C loop (``maxcut_bls.c``, compiled on first use; 10-30x more moves a CPU-second).
:func:`make_search` takes the compiled one where a C compiler works. Both run on the CPU whatever
device the caller names.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from corral.problems.bls_common import DESCENT, DIRECTED, RANDOM, _neighbours, tenure_ranges
from corral.problems.graphs import Graph


class BreakoutSearch:
    """The state of ``N`` breakout local searches on one graph (see the module's docstring).

    ``l0``, ``lmax``: the jump magnitudes (default ``max(1, n / 100)`` and ``max(2, n / 10)``);
    ``stall``: ``T``, local optima without improvement before a break-out (default 10000);
    ``p0``: the least probability of a directed perturbation (0.8); ``tenure``: the range of the
    random tabu tenure, for all searches (default: ``(3, n / 10)`` in odd searches,
    ``(n / 20, n / 10)`` in even ones); ``start``: 0/1 or +-1 assignments
    ``[N, n]`` or ``[n]`` to start from (default uniform random)."""

    def __init__(self, graph: Graph, num_envs: int = 8, seed: int = 0, l0: int | None = None,
                 lmax: int | None = None, stall: int = 10000, p0: float = 0.8,
                 tenure: tuple[int, int] | None = None, start: torch.Tensor | None = None):
        self.n, self.N = n, N = graph.n, int(num_envs)
        self.rng = np.random.default_rng(seed)
        self.nbr, self.nbw = _neighbours(graph)
        self.total_w = float(self.nbw.sum()) / 2
        wabs = np.abs(self.nbw[self.nbw != 0])
        self.tol = 1e-6 * (float(wabs.max()) if wabs.size else 1.0)
        # ties between equal gains go to a small random key per node (redrawn every 256 steps)
        self.tie = 1e-3 * (float(wabs.min()) if wabs.size else 1.0)
        self.thr = self.tie + self.tol  # a key above this is a positive gain
        self.l0 = int(l0 or max(1, round(n / 100)))
        self.lmax = int(lmax or max(2, round(n / 10)))
        self.stall, self.p0 = int(stall), float(p0)
        self.tenure = tenure_ranges(n, N, tenure)
        self.offsets = np.arange(N) * n
        self.rows = np.arange(N)
        self.fkey = self.rng.random(n) + 0.5  # fingerprints of assignments
        if start is None:
            x = self.rng.random((N, n)) < 0.5
        else:
            x = np.broadcast_to(torch.as_tensor(start).cpu().numpy() > 0, (N, n))
        self.s = np.where(x, 1.0, -1.0)
        self.gain = np.empty((N, n))
        self.cut = np.empty(N)
        self.fp = np.empty(N)
        self.recompute()
        self.expiry = np.zeros((N, n), dtype=np.int32)
        self.step_no = 0
        self.mode = np.zeros(N, dtype=np.int64)  # DESCENT, DIRECTED or RANDOM
        self.left = np.zeros(N, dtype=np.int64)  # perturbation moves left
        self.jump = np.full(N, self.l0, dtype=np.int64)  # L
        self.omega = np.zeros(N, dtype=np.int64)
        self.prev_cut = np.full(N, math.nan)
        self.prev_fp = np.zeros(N)
        self.best_cut = self.cut.copy()
        self.best_s = self.s.copy()
        self.best_at_last = self.best_cut.copy()  # each search's best at its last local optimum
        self.moves = 0
        self.key = np.empty((N, n))
        self._pool: np.ndarray | None = None
        self._new_ties()

    # ------------------------------------------------------------------ state
    def recompute(self) -> None:
        """Gains, cuts and fingerprints from the spins (exact; clears any float drift)."""
        h = (self.s[:, self.nbr] * self.nbw).sum(-1)
        np.multiply(self.s, h, out=self.gain)
        self.cut[:] = (self.total_w - self.gain.sum(1) / 2) / 2
        self.fp[:] = self.s @ self.fkey

    def _new_ties(self) -> None:
        self.ties = self.rng.random((self.N, self.n)) * self.tie

    def _draws(self) -> np.ndarray:
        """Three uniforms per search for this step (tenure, random node, perturbation kind), from
        a block drawn every 1024 steps (one numpy call per step costs more than the step's math)."""
        i = self.step_no % 1024
        if i == 0 or self._pool is None:
            self._pool = self.rng.random((1024, 3, self.N))
        return self._pool[i]

    def flip(self, k: np.ndarray, u: np.ndarray) -> None:
        """Flip node ``k[i]`` in search i (every search flips one node); ``u``: a uniform per
        search for the tabu tenure."""
        flat = self.offsets + k
        s_flat, gain_flat = self.s.reshape(-1), self.gain.reshape(-1)
        sk = s_flat[flat]
        gk = gain_flat[flat]
        s_flat[flat] = -sk
        gain_flat[flat] = -gk
        # neighbour j's field moves by -2 w_kj s_k, so its gain s_j h_j by -2 w_kj s_k s_j; a row
        # has no repeated neighbour (padding adds 0 to the node itself)
        nb = self.nbr[k] + self.offsets[:, None]
        gain_flat[nb] += s_flat[nb] * self.nbw[k] * (-2.0 * sk)[:, None]
        self.cut += gk
        self.fp -= 2.0 * sk * self.fkey[k]
        lo, hi = self.tenure[:, 0], self.tenure[:, 1]
        self.expiry.reshape(-1)[flat] = self.step_no + lo + (u * (hi - lo + 1)).astype(np.int32)

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """One move in every search; True when some search beat its best cut before it."""
        u = self._draws()
        key = np.add(self.gain, self.ties, out=self.key)
        k_all = key.argmax(1)
        g_all = key[self.rows, k_all]
        np.copyto(key, -np.inf, where=self.expiry > self.step_no)
        k_nt = key.argmax(1)
        free = key[self.rows, k_nt] > -np.inf
        improved = bool((self.cut > self.best_cut).any())
        if improved:
            self._record_best()
        at_opt = (self.mode == DESCENT) & (g_all <= self.thr)
        if at_opt.any():
            self._local_optimum(at_opt, u[2])
        aspire = (self.cut + g_all) > (self.best_cut + self.thr)
        k = np.where((self.mode == DIRECTED) & ~aspire & free, k_nt, k_all)
        k = np.where(self.mode == RANDOM, (u[1] * self.n).astype(np.int64), k)
        self.flip(k, u[0])
        self.step_no += 1
        self.moves += self.N
        perturbing = self.mode != DESCENT
        self.left -= perturbing
        self.mode[perturbing & (self.left <= 0)] = DESCENT
        if self.step_no % 256 == 0:
            self._new_ties()
        return improved

    def _record_best(self) -> None:
        better = self.cut > self.best_cut
        self.best_s[better] = self.s[better]
        self.best_cut[better] = self.cut[better]

    def _local_optimum(self, at: np.ndarray, u: np.ndarray) -> None:
        """Searches ``at`` a local optimum: adapt ``omega`` and ``L``, pick the perturbation
        (``u``: a uniform per search)."""
        improved = self.best_cut > self.best_at_last
        np.copyto(self.best_at_last, self.best_cut, where=at)
        self.omega = np.where(at, np.where(improved, 0, self.omega + 1), self.omega)
        same = (self.cut == self.prev_cut) & (np.abs(self.fp - self.prev_fp) < 1e-6)
        self.jump = np.where(at, np.where(same, np.minimum(self.jump + 1, self.lmax), self.l0), self.jump)
        np.copyto(self.prev_cut, self.cut, where=at)
        np.copyto(self.prev_fp, self.fp, where=at)
        p_dir = np.maximum(np.exp(self.omega * (-1.0 / self.stall)), self.p0)
        self.mode = np.where(at, np.where(u < p_dir, DIRECTED, RANDOM), self.mode)
        self.left = np.where(at, self.jump, self.left)
        broke = at & (self.omega > self.stall)
        if broke.any():
            self._break_out(broke)

    def _break_out(self, rows: np.ndarray) -> None:
        """Stalled searches restart from a best assignment and take ``Lmax`` random flips: even
        rows from the best of all searches (the elite), odd rows from their own best."""
        elite = self.best_s[int(self.best_cut.argmax())]
        for i in np.flatnonzero(rows):
            self.s[i] = self.best_s[i] if i % 2 == 1 else elite
        self.recompute()
        self.omega[rows] = 0
        self.mode[rows] = RANDOM
        self.left[rows] = self.lmax
        self.prev_cut[rows] = math.nan

    # ------------------------------------------------------------------ the loop
    def best(self) -> tuple[float, torch.Tensor]:
        """The best cut of all searches and its 0/1 assignment (int8 ``[n]``)."""
        self._record_best()
        i = int(self.best_cut.argmax())
        return float(self.best_cut[i]), torch.from_numpy(self.best_s[i] > 0).to(torch.int8)

    def run(self, deadline: float, stop_at: float | None = None, on_best: Callable[[float], None] | None = None,
            on_tick: Callable[[], None] | None = None) -> None:
        """Step until ``deadline`` (a ``time.perf_counter()`` value) or until the best cut reaches
        ``stop_at``; ``on_best(cut)`` whenever the best of all searches rises, ``on_tick()`` about
        once a second (after an exact recomputation of the gains)."""
        top = float(self.best_cut.max())
        if on_best is not None:
            on_best(top)
        next_tick = time.perf_counter() + 1.0
        while True:
            if self.step():
                new = float(self.best_cut.max())
                if new > top:
                    top = new
                    if on_best is not None:
                        on_best(top)
                    if stop_at is not None and top >= stop_at - self.thr:
                        return
            if self.step_no % 64 == 0:
                now = time.perf_counter()
                if now >= deadline:
                    return
                if now >= next_tick:
                    next_tick = now + 1.0
                    self.recompute()
                    if on_tick is not None:
                        on_tick()


def make_search(graph: Graph, num_envs: int, seed: int = 0, **settings):
    """The compiled engine (:mod:`corral.problems.maxcut_bls_kernel`) where a C compiler works and
    the weights are integers (Gset's are), else :class:`BreakoutSearch`; both take ``settings`` (``l0``, ``lmax``, ``stall``, ``p0``,
    ``tenure``, ``start``)."""
    from corral.problems.maxcut_bls_kernel import CompiledBreakoutSearch, integral_weights, load_kernel

    if load_kernel() is not None and integral_weights(_neighbours(graph)[1]):
        return CompiledBreakoutSearch(graph, num_envs, seed=seed, **settings)
    return BreakoutSearch(graph, num_envs, seed=seed, **settings)


def breakout_search(run, graph: Graph, deadline: float, seed: int, stop_at: float | None) -> int:
    """``solve_maxcut``'s ``"bls"`` method on ``run`` (its ``_Search``: the env, the history and
    the progress report); the searches start from their own random assignments. Every rise of the best cut goes into the history when the engine reports it (the
    compiled engine after each turn of a search, a few ms); the best assignment goes back into
    the env for the final polish. Returns the moves made."""
    env = run.env
    search = make_search(graph, run.N, seed=seed)

    def on_best(cut: float) -> None:
        if not run.history or cut > run.history[-1][1]:
            run.history.append((round(time.perf_counter() - run.t0, 3), cut))
        env.best_cut.fill_(max(cut, float(env.best_cut)))

    search.run(deadline, stop_at, on_best, lambda: run.report("bls"))
    cut, x = search.best()
    if cut >= float(env.best_cut):
        env.best_cut.fill_(cut)
        env.best_assignment.copy_(torch.where(x > 0, 1.0, -1.0).to(env.best_assignment.device))
    return search.moves
