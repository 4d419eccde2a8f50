"""Exact reductions for MaxCut on sparse graphs: peel degree-0/1 nodes, contract degree-2 nodes.

With spins on the sides and ``[s_a != s_b]`` for "edge ab is cut":

* **Degree 0**: the node adds nothing; any side.
* **Degree 1** (``v`` joined to ``u`` by weight ``a``): whatever ``u``'s side, ``v`` can take the
  better one, worth ``max(a, 0)`` (opposite ``u`` if ``a > 0``, with ``u`` otherwise). Peel ``v``
  and add ``max(a, 0)`` to the constant.
* **Degree 2** (``v`` joined to ``u`` by ``a`` and to ``w`` by ``b``, ``u != w``): the best ``v``
  is worth ``max(0, a + b)`` if ``u`` and ``w`` are on the same side (``v`` opposite both, or with
  both) and ``max(a, b)`` if they differ (``v`` with ``u`` cuts ``b``, with ``w`` cuts ``a``). That
  is ``C + c [s_u != s_w]`` with the constant ``C = max(0, a + b)`` and a new edge
  ``u - w`` of weight ``c = max(a, b) - max(0, a + b)``; it adds to an existing ``u - w`` edge
  (parallel edges are merged, an edge whose weight sums to 0 is dropped). For unit weights a
  path ``u - v - w`` becomes an edge of weight -1 and the constant 2.

Each rule is applied until every node left has degree >= 3 (the reduced graph, possibly empty).
For any assignment ``x`` of the reduced graph, :meth:`Reduction.lift` gives each removed node its
best side (in the reverse order of removal), so that

    cut(original, lift(x)) == cut(reduced, x) + constant

exactly; a maximum cut of the reduced graph lifts to a maximum cut of the original (the
reductions are exact, tests/test_maxcut_reduce.py checks both by brute force).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from corral.problems.graphs import Graph

_LEAF, _CHAIN, _FREE = 1, 2, 0


@dataclass
class Reduction:
    """The result of :func:`reduce_maxcut`: ``reduced`` (nodes renumbered ``0..k-1``),
    ``kept`` (the original id of each reduced node), ``constant`` (the cut the removed nodes add
    at best), and the removal steps :meth:`lift` undoes."""

    original: Graph
    reduced: Graph
    kept: torch.Tensor  # int64 [k]
    constant: float
    steps: list[tuple] = field(default_factory=list)  # (kind, v, u, w, a, b) in the order of removal
    seconds: float = 0.0

    @property
    def removed(self) -> int:
        return self.original.n - self.reduced.n

    def lift(self, x_reduced: torch.Tensor) -> torch.Tensor:
        """The original graph's assignment (int8 0/1 ``[n]``) from the reduced graph's
        ``x_reduced`` (``[k]``, 0/1, bool or +-1): its cut is ``cut(reduced, x) + constant``."""
        xr = torch.as_tensor(x_reduced).reshape(-1).to("cpu")
        if xr.numel() != self.reduced.n:
            raise ValueError(f"lift: the reduced graph has {self.reduced.n} nodes, the assignment {xr.numel()}")
        side = [0] * self.original.n
        for i, b in zip(self.kept.tolist(), (xr > 0).tolist()):
            side[i] = int(b)
        for kind, v, u, w, a, b in reversed(self.steps):
            if kind == _LEAF:  # cut the edge if it pays
                side[v] = 1 - side[u] if a > 0 else side[u]
            elif kind == _CHAIN:
                if side[u] == side[w]:
                    side[v] = 1 - side[u] if a + b > 0 else side[u]
                else:  # with u: cuts b; with w: cuts a
                    side[v] = side[u] if b >= a else side[w]
            else:
                side[v] = 0
        return torch.tensor(side, dtype=torch.int8)

    def describe(self) -> dict:
        return {"nodes": self.original.n, "edges": self.original.m, "reduced_nodes": self.reduced.n,
                "reduced_edges": self.reduced.m, "constant": self.constant,
                "reduce_seconds": round(self.seconds, 3)}


def reduce_maxcut(graph: Graph) -> Reduction:
    """Apply the degree-0/1/2 reductions (module docstring) until none applies."""
    t0 = time.perf_counter()
    n = graph.n
    adj: list[dict[int, float]] = [{} for _ in range(n)]
    for a, b, c in zip(graph.u.tolist(), graph.v.tolist(), graph.w.tolist()):
        _add(adj, a, b, float(c))
    removed = [False] * n
    steps: list[tuple] = []
    constant = 0.0
    queue = [v for v in range(n) if len(adj[v]) <= 2]
    while queue:
        v = queue.pop()
        if removed[v] or len(adj[v]) > 2:
            continue
        nbrs = list(adj[v].items())
        removed[v] = True
        if not nbrs:
            steps.append((_FREE, v, -1, -1, 0.0, 0.0))
            continue
        for u, _ in nbrs:
            del adj[u][v]
        adj[v] = {}
        if len(nbrs) == 1:
            (u, a), = nbrs
            constant += max(a, 0.0)
            steps.append((_LEAF, v, u, -1, a, 0.0))
            queue.append(u)
        else:
            (u, a), (w, b) = nbrs
            both = max(0.0, a + b)
            constant += both
            _add(adj, u, w, max(a, b) - both)
            steps.append((_CHAIN, v, u, w, a, b))
            queue += [u, w]
    kept = [v for v in range(n) if not removed[v]]
    new_id = {v: i for i, v in enumerate(kept)}
    us, vs, ws = [], [], []
    for a in kept:
        for b, c in adj[a].items():
            if a < b:
                us.append(new_id[a])
                vs.append(new_id[b])
                ws.append(c)
    reduced = Graph(len(kept), torch.tensor(us, dtype=torch.long), torch.tensor(vs, dtype=torch.long),
                    torch.tensor(ws, dtype=torch.float32), f"{graph.name}_reduced")
    return Reduction(graph, reduced, torch.tensor(kept, dtype=torch.long), constant, steps,
                     time.perf_counter() - t0)


def _add(adj: list[dict[int, float]], a: int, b: int, c: float) -> None:
    """Add weight ``c`` to edge ``a - b`` (merging parallel edges, dropping a zero sum)."""
    total = adj[a].get(b, 0.0) + c
    if total == 0.0:
        adj[a].pop(b, None)
        adj[b].pop(a, None)
    else:
        adj[a][b] = adj[b][a] = total
