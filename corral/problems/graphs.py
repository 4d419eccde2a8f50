"""Weighted undirected graphs for combinatorial problems: Gset files and random generators.

A :class:`Graph` is an edge list held as tensors (0-based node ids). Problems build
what they need from it, e.g. :meth:`Graph.neighbor_table` for batched local updates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from corral.errors import UserError


@dataclass(frozen=True)
class Graph:
    """``n`` nodes, edges ``(u[i], v[i])`` with weight ``w[i]``; no self loops."""

    n: int
    u: torch.Tensor  # int64 [m]
    v: torch.Tensor  # int64 [m]
    w: torch.Tensor  # float32 [m]
    name: str = "graph"

    @property
    def m(self) -> int:
        return int(self.u.numel())

    @property
    def device(self) -> torch.device:
        return self.u.device

    def to(self, device) -> "Graph":
        d = torch.device(device)
        return Graph(self.n, self.u.to(d), self.v.to(d), self.w.to(d), self.name)

    def degree(self) -> torch.Tensor:
        """Number of incident edges per node (int64 ``[n]``)."""
        return torch.bincount(torch.cat([self.u, self.v]), minlength=self.n)

    def weighted_degree(self) -> torch.Tensor:
        """Sum of |w| of incident edges per node (float32 ``[n]``)."""
        out = torch.zeros(self.n, dtype=torch.float32, device=self.device)
        a = self.w.abs()
        return out.index_add_(0, self.u, a).index_add_(0, self.v, a)

    def neighbor_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded adjacency lists ``(nbr [n + 1, D], nbw [n + 1, D])``, D the largest degree.

        Padding points at the dummy node ``n`` with weight 0, and row ``n`` is all padding,
        so a batched update ``h.scatter_add_(1, nbr[k], ...)`` on ``h`` of width ``n + 1``
        needs no masks. Parallel edges stay separate entries (their weights add up).
        """
        n, dev = self.n, self.device
        src = torch.cat([self.u, self.v])
        dst = torch.cat([self.v, self.u])
        wt = torch.cat([self.w, self.w]).to(torch.float32)
        deg = torch.bincount(src, minlength=n)
        width = max(1, int(deg.max())) if src.numel() else 1
        order = torch.argsort(src, stable=True)
        src, dst, wt = src[order], dst[order], wt[order]
        start = torch.zeros(n + 1, dtype=torch.long, device=dev)
        start[1:] = torch.cumsum(deg, 0)
        pos = torch.arange(src.numel(), device=dev) - start[src]
        nbr = torch.full((n + 1, width), n, dtype=torch.long, device=dev)
        nbw = torch.zeros(n + 1, width, dtype=torch.float32, device=dev)
        nbr[src, pos] = dst
        nbw[src, pos] = wt
        return nbr, nbw

    def dense(self) -> torch.Tensor:
        """The symmetric weight matrix ``[n, n]`` (small graphs and tests)."""
        a = torch.zeros(self.n, self.n, dtype=torch.float32, device=self.device)
        a.index_put_((self.u, self.v), self.w.float(), accumulate=True)
        a.index_put_((self.v, self.u), self.w.float(), accumulate=True)
        return a


def from_edges(n: int, edges, name: str = "graph") -> Graph:
    """A graph from ``(u, v)`` or ``(u, v, w)`` tuples with 0-based ids."""
    us, vs, ws = [], [], []
    for e in edges:
        us.append(int(e[0]))
        vs.append(int(e[1]))
        ws.append(float(e[2]) if len(e) > 2 else 1.0)
    return _checked(n, us, vs, ws, name)


def _checked(n: int, us, vs, ws, name: str, where: str = "") -> Graph:
    if n < 1:
        raise UserError(f"{where or name}: a graph needs at least one node, got n={n}")
    u = torch.tensor(us, dtype=torch.long)
    v = torch.tensor(vs, dtype=torch.long)
    w = torch.tensor(ws, dtype=torch.float32)
    if u.numel():
        if int(torch.minimum(u, v).min()) < 0 or int(torch.maximum(u, v).max()) >= n:
            raise UserError(f"{where or name}: edge endpoints must be node ids in [0, {n}) (1-based in files)")
        if bool((u == v).any()):
            i = int((u == v).nonzero()[0, 0])
            raise UserError(f"{where or name}: edge {i + 1} is a self loop on node {int(u[i])}; remove it")
        if not bool(torch.isfinite(w).all()):
            raise UserError(f"{where or name}: edge weights must be finite numbers")
    return Graph(n, u, v, w, name)


def read_gset(path: str | Path) -> Graph:
    """Read a Gset file: a header ``n m``, then ``m`` lines ``u v w`` with 1-based node ids.

    Weights may be any finite number (Gset uses 1 and -1). Blank lines and lines starting
    with ``#`` or ``%`` are skipped. Errors name the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"graph file {str(path)!r} does not exist")
    lines = [(i + 1, ln.split()) for i, ln in enumerate(path.read_text().splitlines())]
    lines = [(i, parts) for i, parts in lines if parts and not parts[0].startswith(("#", "%"))]
    if not lines:
        raise UserError(f"{path}: empty graph file; expected a header line 'n_nodes n_edges'")
    lineno, header = lines[0]
    try:
        n, m = int(header[0]), int(header[1])
        if len(header) != 2:
            raise ValueError
    except (ValueError, IndexError):
        raise UserError(f"{path}:{lineno}: expected a header 'n_nodes n_edges', got {' '.join(header)!r}") from None
    us, vs, ws = [], [], []
    for lineno, parts in lines[1:]:
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            us.append(int(parts[0]) - 1)
            vs.append(int(parts[1]) - 1)
            ws.append(float(parts[2]) if len(parts) == 3 else 1.0)
        except ValueError:
            raise UserError(f"{path}:{lineno}: expected an edge 'u v weight', got {' '.join(parts)!r}") from None
    if len(us) != m:
        raise UserError(f"{path}: the header says {m} edges but the file has {len(us)}")
    return _checked(n, us, vs, ws, path.stem, where=str(path))


def write_gset(graph: Graph, path: str | Path) -> None:
    """Write ``graph`` in the Gset format (1-based ids; integral weights written as ints)."""
    rows = [f"{graph.n} {graph.m}"]
    for a, b, c in zip(graph.u.tolist(), graph.v.tolist(), graph.w.tolist()):
        rows.append(f"{a + 1} {b + 1} {int(c) if float(c).is_integer() else c}")
    Path(path).write_text("\n".join(rows) + "\n")


def erdos_renyi(n: int, p: float, seed: int = 0, weights: tuple[float, ...] = (1.0,)) -> Graph:
    """G(n, p): each of the n(n-1)/2 pairs is an edge with probability ``p``; weights drawn
    uniformly from ``weights`` (``(1.0, -1.0)`` gives Gset-style signed graphs)."""
    if not 0.0 <= p <= 1.0:
        raise UserError(f"erdos_renyi: p must be in [0, 1], got {p}")
    g = torch.Generator().manual_seed(seed)
    iu = torch.triu_indices(n, n, offset=1)
    keep = torch.rand(iu.shape[1], generator=g) < p
    u, v = iu[0][keep], iu[1][keep]
    wv = torch.tensor(weights, dtype=torch.float32)
    w = wv[torch.randint(len(weights), (u.numel(),), generator=g)]
    return Graph(n, u.contiguous(), v.contiguous(), w, f"er{n}_p{p:g}_s{seed}")


def barabasi_albert(n: int, m: int, seed: int = 0, weights: tuple[float, ...] = (1.0,)) -> Graph:
    """Barabasi-Albert preferential attachment: each new node links to ``m`` distinct existing
    nodes chosen with probability proportional to their degree (started from a star on m+1)."""
    if not 1 <= m < n:
        raise UserError(f"barabasi_albert: need 1 <= m < n, got m={m}, n={n}")
    rng = random.Random(seed)
    edges: list[tuple[int, int]] = [(i, m) for i in range(m)]  # node m joins nodes 0..m-1
    ends: list[int] = [x for e in edges for x in e]  # each node once per incident edge
    for new in range(m + 1, n):
        targets: set[int] = set()
        while len(targets) < m:
            targets.add(rng.choice(ends))
        for t in sorted(targets):
            edges.append((t, new))
            ends += [t, new]
    wrng = random.Random(seed + 1)
    ws = [wrng.choice(weights) for _ in edges]
    g = from_edges(n, [(a, b, c) for (a, b), c in zip(edges, ws)], name=f"ba{n}_m{m}_s{seed}")
    return g
