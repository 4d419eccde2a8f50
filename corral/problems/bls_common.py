"""What the breakout local search's numpy engine (``maxcut_bls``) and its compiled loop
(``maxcut_bls_kernel``) share: the perturbation modes, the padded adjacency and the tabu
tenure ranges; a module of its own so that neither of the two imports the other."""

from __future__ import annotations

import numpy as np

from corral.problems.graphs import Graph

DESCENT, DIRECTED, RANDOM = 0, 1, 2


def _neighbours(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Padded adjacency ``(nbr [n, D], nbw [n, D])`` with parallel edges merged (so one row has
    no repeated neighbour) and padding pointing at the node itself with weight 0."""
    g = graph.to("cpu")
    n = g.n
    u, v, w = g.u.numpy(), g.v.numpy(), g.w.double().numpy()
    a, b = np.minimum(u, v), np.maximum(u, v)
    pair, inv = np.unique(a * n + b, return_inverse=True)
    wsum = np.bincount(inv, weights=w, minlength=pair.size)
    keep = wsum != 0
    a, b, wsum = pair[keep] // n, pair[keep] % n, wsum[keep]
    src, dst, wt = np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([wsum, wsum])
    deg = np.bincount(src, minlength=n)
    width = max(1, int(deg.max()) if deg.size else 1)
    order = np.argsort(src, kind="stable")
    src, dst, wt = src[order], dst[order], wt[order]
    start = np.concatenate([[0], np.cumsum(deg)])
    pos = np.arange(src.size) - start[src]
    nbr = np.repeat(np.arange(n)[:, None], width, axis=1)
    nbw = np.zeros((n, width))
    nbr[src, pos] = dst
    nbw[src, pos] = wt
    return nbr, nbw


def tenure_ranges(n: int, N: int, tenure: tuple[int, int] | None) -> np.ndarray:
    """Each search's tabu tenure range ``[N, 2]`` (see the module's docstring)."""
    if tenure is not None:
        lo, hi = int(tenure[0]), int(tenure[1])
        return np.tile([lo, max(lo, hi)], (N, 1)).astype(np.int64)
    hi = max(4, n // 10)
    lo = np.where(np.arange(N) % 2 == 1, 3, min(hi, max(3, n // 20)))
    return np.stack([lo, np.full(N, hi)], 1).astype(np.int64)
