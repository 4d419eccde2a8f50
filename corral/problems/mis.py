"""Maximum independent set and minimum vertex cover: one problem seen twice.

A set S of nodes is independent if no edge has both ends in S; its complement is then a vertex
cover (every edge has an end in it), so a maximum independent set of a graph is the complement of
a minimum vertex cover. :class:`IndependentSet` searches independent sets; with ``cover=True``
it reports (and checks) the complementary covers.

Batched state: ``x [B, n]`` bool (node in the set), and the *tightness* ``A x`` (how many
neighbours in the set), one sparse matrix product for all chains. The local search
(:meth:`IndependentSet.improve`) is ARW-style: insert free nodes (tightness 0) in parallel
Luby rounds, preferring nodes with few free neighbours, then (1,2)-swap passes: take out set
nodes that have two or more 1-tight neighbours (neighbours whose only set neighbour they are)
and refill; a chain keeps the move if its set did not shrink.

Instances: :func:`erdos_renyi_mis` (G(n, p), numpy-seeded, fast for 10^4 nodes), :func:`model_rb`
(Model RB with a planted solution, the BHOSLIB construction: the optimum is known), and graph
files (Gset-style ``n m`` headers or DIMACS ``p edge`` / ``e u v`` lines).

Baselines (not learned, for comparison in the same run): :func:`greedy_min_degree`,
:func:`networkx_maximal` (networkx's random maximal independent set), :func:`arw_ils`
(Andrade-Resende-Werneck iterated local search with (1,2)-swaps, in plain Python) and
:func:`exact_milp` (HiGHS through ``scipy.optimize.milp``, for small instances).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch

from corral.errors import UserError
from corral.problems.base import InfeasibleSolution, Problem, Result, Tracker
from corral.problems.graphs import Graph

# ------------------------------------------------------------------------------------ instances


def _graph(n: int, u, v, name: str) -> Graph:
    u = torch.as_tensor(np.asarray(u), dtype=torch.long)
    v = torch.as_tensor(np.asarray(v), dtype=torch.long)
    return Graph(n, u.contiguous(), v.contiguous(), torch.ones(u.numel(), dtype=torch.float32), name)


def erdos_renyi_mis(n: int, p: float, seed: int = 0) -> Graph:
    """G(n, p) drawn row block by row block with numpy (seeded; 10^4 nodes in a second or two)."""
    if n < 1 or not 0.0 <= p <= 1.0:
        raise UserError(f"erdos_renyi: need n >= 1 and p in [0, 1], got n={n}, p={p}")
    rng = np.random.default_rng(seed)
    us, vs = [], []
    block = max(1, 2_000_000 // max(n, 1))
    cols = np.arange(n)
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        hit = rng.random((rows.size, n)) < p
        hit &= cols[None, :] > rows[:, None]
        r, c = np.nonzero(hit)
        us.append(rows[r])
        vs.append(c)
    return _graph(n, np.concatenate(us), np.concatenate(vs), f"er{n}_p{p:g}_s{seed}")


def model_rb(n: int, d: int, seed: int = 0, p: float = 0.25, r: float | None = None) -> tuple[Graph, torch.Tensor]:
    """A Model RB instance with a planted solution, as BHOSLIB's frb<n>-<d> graphs are built.

    ``n`` variables with ``d`` values each; node ``i * d + a`` is "variable i takes value a". The
    ``d`` nodes of a variable form a clique. ``m = round(r n ln n)`` constraints each join two
    distinct random variables and forbid ``round(p d^2)`` random value pairs (edges), never the
    planted pair. ``r = alpha / -ln(1 - p)`` with ``d = n^alpha`` (the threshold of Model RB),
    so the instances are hard. The planted assignment is an independent set of size ``n``, and no
    independent set is larger (one node per clique at most): the optimum is ``n``.
    Returns ``(graph, planted)``, planted a bool ``[n * d]`` mask.
    """
    if n < 2 or d < 2:
        raise UserError(f"model_rb: need at least 2 variables and 2 values, got n={n}, d={d}")
    if not 0.0 < p < 1.0:
        raise UserError(f"model_rb: the tightness p must be in (0, 1), got {p}")
    rng = random.Random(seed)
    alpha = math.log(d) / math.log(n)
    r = alpha / -math.log(1.0 - p) if r is None else r
    m = int(round(r * n * math.log(n)))
    t = max(1, min(d * d - 1, int(round(p * d * d))))
    planted = [rng.randrange(d) for _ in range(n)]
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        for a in range(d):
            for b in range(a + 1, d):
                edges.add((i * d + a, i * d + b))
    for _ in range(m):
        x, y = rng.sample(range(n), 2)
        skip = planted[x] * d + planted[y]
        for code in rng.sample(range(d * d - 1), t):
            code += code >= skip  # never the planted pair
            a, b = divmod(code, d)
            e = (x * d + a, y * d + b)
            edges.add((min(e), max(e)))
    es = sorted(edges)
    g = _graph(n * d, [e[0] for e in es], [e[1] for e in es], f"rb{n}-{d}_s{seed}")
    mask = torch.zeros(n * d, dtype=torch.bool)
    mask[torch.tensor([i * d + a for i, a in enumerate(planted)])] = True
    return g, mask


def read_graph(path: str | Path) -> Graph:
    """A graph file: DIMACS (``p edge n m`` / ``p col n m``, ``e u v`` lines; BHOSLIB's format) or
    Gset-style (``n m`` header, ``u v [w]`` lines). Ids are 1-based; weights are ignored."""
    from corral.problems.graphs import read_gset

    path = Path(path)
    if not path.is_file():
        raise UserError(f"graph file {str(path)!r} does not exist; give a graph file (DIMACS 'p edge' or "
                        "Gset 'n m' header) or a generator such as er:800:0.15:0 or rb:30:15:0")
    head = next((ln for ln in path.read_text().splitlines() if ln.strip() and ln.split()[0] not in ("c", "%", "#")), "")
    if not head.startswith("p"):
        g = read_gset(path)
        return _graph(g.n, g.u, g.v, g.name)
    n, us, vs = None, [], []
    for lineno, ln in enumerate(path.read_text().splitlines(), 1):
        parts = ln.split()
        if not parts or parts[0] in ("c", "%", "#"):
            continue
        try:
            if parts[0] == "p":
                n = int(parts[2])
            elif parts[0] == "e":
                us.append(int(parts[1]) - 1)
                vs.append(int(parts[2]) - 1)
            else:
                raise ValueError
        except (ValueError, IndexError):
            raise UserError(f"{path}:{lineno}: expected 'p edge N M' or 'e U V', got {ln.strip()!r}") from None
    if n is None:
        raise UserError(f"{path}: no 'p edge N M' line")
    u, v = np.array(us, dtype=np.int64), np.array(vs, dtype=np.int64)
    if u.size and (min(u.min(), v.min()) < 0 or max(u.max(), v.max()) >= n):
        raise UserError(f"{path}: edge endpoints must be node ids in [1, {n}]")
    keep = u != v
    return _graph(n, u[keep], v[keep], path.stem)


GENERATORS = "er:N:P[:SEED] (Erdos-Renyi G(N, P)) or rb:N:D[:SEED[:P]] (Model RB, planted optimum N)"


def load_graph(spec: str) -> tuple[Graph, torch.Tensor | None]:
    """A graph from a file path or a generator spec (see ``GENERATORS``); returns the planted
    solution of an ``rb:`` instance, else None."""
    head = spec.split(":")[0]
    if head in ("er", "rb") and ":" in spec:
        parts = spec.split(":")[1:]
        try:
            if head == "er":
                if len(parts) not in (2, 3):
                    raise ValueError
                return erdos_renyi_mis(int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) > 2 else 0), None
            if len(parts) not in (2, 3, 4):
                raise ValueError
            return model_rb(int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0,
                            float(parts[3]) if len(parts) > 3 else 0.25)
        except ValueError:
            raise UserError(f"instance {spec!r} is not a generator spec; use {GENERATORS}") from None
    return read_graph(spec), None


# ------------------------------------------------------------------------------------ the problem


class IndependentSet(Problem):
    """Maximum independent set of ``graph`` (``cover=True``: minimum vertex cover, the
    complement). ``planted``: a known optimal independent set (Model RB), giving ``optimum``."""

    def __init__(self, graph: Graph, cover: bool = False, planted: torch.Tensor | None = None,
                 device: str | torch.device = "cpu", swap_passes: int = 3):
        self.device = torch.device(device)
        self.cover = cover
        self.kind = "vc" if cover else "mis"
        self.sense = "min" if cover else "max"
        self.n = n = graph.n
        self.name = graph.name
        u, v = graph.u.cpu(), graph.v.cpu()
        keep = u != v
        u, v = u[keep], v[keep]
        lo, hi = torch.minimum(u, v), torch.maximum(u, v)
        pairs = torch.unique(lo * n + hi)
        self.u, self.v = (pairs // n).to(self.device), (pairs % n).to(self.device)
        self.m = int(pairs.numel())
        idx = torch.stack([torch.cat([self.u, self.v]), torch.cat([self.v, self.u])])
        import warnings

        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore")
            self.A = torch.sparse_coo_tensor(idx, torch.ones(idx.shape[1], device=self.device), (n, n),
                                             check_invariants=True).coalesce().to_sparse_csr()
        self.degree = torch.bincount(idx[0], minlength=n).to(self.device)
        self.ids1 = torch.arange(1, n + 1, dtype=torch.float32, device=self.device)
        self.swap_passes = swap_passes
        self.planted = None if planted is None else planted.to(torch.bool).cpu()
        if self.planted is not None:
            size = int(self.planted.sum())
            self.optimum = float(n - size if cover else size)
        else:
            self.optimum = None

    def describe(self):
        return {"nodes": self.n, "edges": self.m}

    # -- batched, internal (independent sets)
    def tight(self, x: torch.Tensor) -> torch.Tensor:
        """Set neighbours of every node, ``[B, n]`` float."""
        return torch.sparse.mm(self.A, x.t().float()).t()

    def score(self, x):
        return x.sum(1).to(torch.float64)

    def feasible(self, x):
        return ~(x & (self.tight(x) > 0)).any(1)

    def insert_free(self, x: torch.Tensor, gen=None, banned: torch.Tensor | None = None) -> torch.Tensor:
        """Add free nodes (no set neighbour) until none is left: parallel greedy rounds in which a
        free node joins if it has fewer free neighbours than each free neighbour (ties broken at
        random), the batched form of min-degree greedy."""
        for _ in range(self.n):
            free = ~x & (self.tight(x) == 0)
            if banned is not None:
                free &= ~banned
            if not bool(free.any()):
                break
            dfree = self.tight(free)
            key = (self.n + 1.0 - dfree + torch.rand(free.shape, generator=gen, device=self.device)) * free
            nbmax = torch.sparse.mm(self.A, key.t().contiguous(), reduce="amax").t()
            x = x | (free & (key > nbmax))
        return x

    def repair(self, x, keep=None, gen=None):
        """An independent set from any 0/1 rows: nodes in ``keep`` win their conflicts (among
        themselves at random), conflicting others leave; then free nodes are added."""
        if keep is not None and bool(keep.any()):
            k = keep & x
            while True:  # conflicts inside keep: each conflicting node leaves with probability 1/2
                clash = k & (self.tight(k) > 0)
                if not bool(clash.any()):
                    break
                k = k & ~(clash & (torch.rand(clash.shape, generator=gen, device=self.device) < 0.5))
            x = (x & ~(self.tight(k) > 0)) | k
        x = x & ~(self.tight(x) > 0)
        return self.insert_free(x, gen)

    def swap_pass(self, x: torch.Tensor, gen=None) -> torch.Tensor:
        """One round of (1,2)-swaps in every chain: set nodes with >= 2 one-tight neighbours
        leave (each with probability 1/2), their freed neighbours are inserted, and a chain keeps
        the move unless its set shrank."""
        t = self.tight(x)
        one = ~x & (t == 1)
        mate = torch.sparse.mm(self.A, (x.float() * self.ids1).t()).t()  # id + 1 of the only set neighbour
        owner = torch.where(one, mate.long() - 1, 0)
        cnt = torch.zeros(x.shape, device=self.device).scatter_add_(1, owner, one.float())
        cand = x & (cnt >= 2)
        if not bool(cand.any()):
            return x
        out = cand & (torch.rand(x.shape, generator=gen, device=self.device) < 0.5)
        y = self.insert_free(x & ~out, gen, banned=out)
        y = self.insert_free(y, gen)
        ok = (y.sum(1) >= x.sum(1)).unsqueeze(1)
        return torch.where(ok, y, x)

    def improve(self, x, gen=None):
        x = self.insert_free(x, gen)
        for _ in range(self.swap_passes):
            x = self.swap_pass(x, gen)
        return x

    def random(self, batch, gen=None):
        x = torch.zeros(batch, self.n, dtype=torch.bool, device=self.device)
        return self.improve(self.insert_free(x, gen), gen)

    # -- the user's side
    def export(self, x):
        s = x.to("cpu", torch.int8)
        return 1 - s if self.cover else s

    def value_of_score(self, score):
        return float(self.n - score) if self.cover else float(score)

    def check(self, solution) -> float:
        s = self._as_solution(solution).bool()
        u, v = self.u.cpu(), self.v.cpu()
        if self.cover:
            bad = ~(s[u] | s[v])
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise InfeasibleSolution(f"vc {self.name}: not a vertex cover, edge ({int(u[i]) + 1}, {int(v[i]) + 1}) "
                                         "has neither end in it")
        else:
            bad = s[u] & s[v]
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise InfeasibleSolution(f"mis {self.name}: not an independent set, nodes {int(u[i]) + 1} and "
                                         f"{int(v[i]) + 1} are both in it and adjacent")
        return float(s.sum())

    def adjacency_lists(self) -> list[list[int]]:
        adj: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in zip(self.u.tolist(), self.v.tolist()):
            adj[a].append(b)
            adj[b].append(a)
        return adj

    def result(self, method: str, is_mask, seconds: float, tracker: Tracker, info=None) -> Result:
        """A :class:`Result` for an independent-set mask found by a baseline (exported, checked)."""
        x = torch.as_tensor(np.asarray(is_mask, dtype=bool))
        solution = self.export(x)
        hist = [(t, self.value_of_score(v)) for t, v in tracker.history]
        return Result(problem=self.kind, instance=self.name, method=method, sense=self.sense,
                      value=self.check(solution), solution=solution, seconds=round(seconds, 3),
                      time_to_best=tracker.time_to_best, history=hist, optimum=self.optimum, info=info or {})



# the baselines, in their own module (imported here, where callers have always found them)
from corral.problems.mis_baselines import (  # noqa: E402, F401
    arw_ils,
    clique_cover,
    exact_cpsat,
    exact_milp,
    greedy_min_degree,
    networkx_maximal,
    node_cliques,
)
