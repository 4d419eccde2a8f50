"""A sum tree (with a min tree beside it) over torch tensors, updated and searched in batches.

Leaves hold non-negative priorities. Every internal node holds the sum of its
children, so the root is the total and a prefix sum ``u`` in ``[0, total)`` finds
the leaf ``i`` with ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])`` in one walk
from the root. The walk is done for a whole batch at once, one tree level per
step, so a batch of B look-ups costs a few tensor operations per level, not B
Python iterations.

Each node has ``fanout`` children (32 by default, not 2). On a CPU the cost of a
tensor operation on a few hundred numbers is its fixed overhead, so what counts
is the number of levels: a binary tree over 5M leaves has 23, a 32-ary one has 5.
A level is stored padded to a multiple of ``fanout`` and viewed as
``[parents, fanout]``, so the children of a set of nodes come out in one gather.

The min tree keeps the smallest *positive* leaf (zero leaves count as ``+inf``):
prioritized replay normalises importance weights by the largest weight, which
belongs to the smallest priority among the transitions that can be sampled.
"""

from __future__ import annotations

from typing import Any

import torch


class SumTree:
    """Batched sum tree over ``capacity`` leaves, plus a min tree over positive leaves.

    Args:
        capacity: number of leaves.
        device: where the tree lives (found indices come back there).
        dtype: float64 by default so that sums over millions of leaves do not
            drift far enough to matter for sampling proportions.
        fanout: children per node.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float64,
        fanout: int = 32,
    ):
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be at least 1, got {capacity}")
        if fanout < 2:
            raise ValueError(f"SumTree fanout must be at least 2, got {fanout}")
        self.capacity, self.fanout = int(capacity), int(fanout)
        self.device = torch.device(device)
        self.dtype = dtype
        self._sizes = self._level_sizes(self.capacity, self.fanout)
        self.depth = len(self._sizes) - 1  # steps from the root to a leaf
        self._sums = torch.zeros(sum(self._sizes), dtype=dtype, device=self.device)
        self._mins = torch.full((sum(self._sizes),), float("inf"), dtype=dtype, device=self.device)
        # Views, made once: level l of each tree, and level l grouped by parent.
        starts = [sum(self._sizes[:i]) for i in range(len(self._sizes))]
        self._sum_levels = [self._sums[s : s + n] for s, n in zip(starts, self._sizes)]
        self._min_levels = [self._mins[s : s + n] for s, n in zip(starts, self._sizes)]
        self._sum_groups = [lvl.view(-1, self.fanout) if i else lvl for i, lvl in enumerate(self._sum_levels)]
        self._min_groups = [lvl.view(-1, self.fanout) if i else lvl for i, lvl in enumerate(self._min_levels)]
        self._down = torch.full((1, 1), float("-inf"), dtype=dtype, device=self.device)

    @staticmethod
    def _level_sizes(capacity: int, fanout: int) -> list[int]:
        """Nodes per level, root first; every level below the root is padded to a multiple of fanout."""
        sizes = []
        n = capacity
        while True:
            padded = -(-n // fanout) * fanout
            sizes.append(padded)
            n = padded // fanout
            if n == 1:
                break
        sizes.append(1)
        return sizes[::-1]

    @classmethod
    def bytes_needed(cls, capacity: int, dtype: torch.dtype = torch.float64, fanout: int = 32) -> int:
        """Bytes a tree of this capacity allocates (sum tree and min tree)."""
        return 2 * sum(cls._level_sizes(capacity, fanout)) * torch.empty((), dtype=dtype).element_size()

    # -- reading ---------------------------------------------------------------------------------

    @property
    def leaves(self) -> torch.Tensor:
        """View of the leaf values."""
        return self._sum_levels[-1][: self.capacity]

    @property
    def total(self) -> torch.Tensor:
        """Sum of all leaves, a 0-dim tensor."""
        return self._sums[0]

    @property
    def min(self) -> torch.Tensor:
        """Smallest positive leaf as a 0-dim tensor (``inf`` when every leaf is zero)."""
        return self._mins[0]

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        return self._sum_levels[-1][indices]

    @property
    def nbytes(self) -> int:
        return self._sums.nbytes + self._mins.nbytes

    # -- writing ---------------------------------------------------------------------------------

    def update(self, indices: torch.Tensor, values: torch.Tensor, unique: bool = False) -> None:
        """Set ``leaves[indices] = values`` and repair the paths to the root.

        When an index appears more than once, the last value wins, as if the
        updates were applied one after another. ``unique=True`` promises there
        are no repeats and skips the work of dropping them.
        """
        if indices.numel() == 0:
            return
        if not unique and indices.numel() > 1:
            # Keep the last occurrence of each index: a stable sort groups repeats
            # in their original order, and the last of each group is kept.
            indices, order = torch.sort(indices, stable=True)
            last = torch.ones_like(indices, dtype=torch.bool)
            torch.ne(indices[1:], indices[:-1], out=last[:-1])
            indices, values = indices[last], values[order[last]]
        values = values.to(self.dtype)
        self._sum_levels[-1].index_copy_(0, indices, values)
        self._min_levels[-1].index_copy_(0, indices, torch.where(values > 0, values, float("inf")))

        # Parents are recomputed from their children (not nudged by a delta), so
        # rounding errors never accumulate. Repeated parents write equal values.
        node = indices
        for level in range(self.depth - 1, -1, -1):
            node = node // self.fanout
            self._sum_levels[level].index_copy_(0, node, self._sum_groups[level + 1][node].sum(1))
            self._min_levels[level].index_copy_(0, node, self._min_groups[level + 1][node].amin(1))

    def clear(self) -> None:
        self._sums.zero_()
        self._mins.fill_(float("inf"))

    # -- searching -------------------------------------------------------------------------------

    def find(self, prefix_sums: torch.Tensor) -> torch.Tensor:
        """For each ``u`` in ``prefix_sums``, the leaf whose cumulative range holds ``u``.

        ``u`` is expected in ``[0, total)``; values at or past ``total`` (rounding)
        end on the last positive leaf. A leaf with zero priority is never returned
        while the total is positive.
        """
        u = prefix_sums.to(self.dtype).reshape(-1, 1)
        node = torch.zeros(u.shape[0], dtype=torch.long, device=self.device)
        for level in range(1, self.depth + 1):
            cum = self._sum_groups[level][node].cumsum(1)  # [B, fanout]
            # Keep u below this node's mass (rounding can put it on or past the end);
            # then the first child whose cumulative mass passes u is the one to
            # enter, and that child has positive mass, since its cumsum grew.
            u = torch.minimum(u, torch.nextafter(cum[:, -1:], self._down))
            child = torch.searchsorted(cum, u, right=True)
            # Mass before the chosen child, from the same cumsum the choice used, so u stays >= 0.
            u = u - torch.nn.functional.pad(cum, (1, 0)).gather(1, child)
            node = node * self.fanout + child.squeeze(1)
        return node.clamp_(max=self.capacity - 1)

    # -- checkpointing ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # The inner nodes follow from the leaves; saving only the leaves keeps
        # checkpoints small and an inconsistent tree impossible.
        return {"capacity": self.capacity, "leaves": self.leaves.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"SumTree checkpoint has capacity {int(state['capacity'])} but this tree has {self.capacity}"
            )
        leaves = state["leaves"].to(device=self.device, dtype=self.dtype)
        self.clear()
        self._sum_levels[-1][: self.capacity] = leaves
        self._min_levels[-1][: self.capacity] = torch.where(leaves > 0, leaves, float("inf"))
        self._rebuild()

    def _rebuild(self) -> None:
        """Recompute every inner node from the leaves, a whole level at a time."""
        for level in range(self.depth - 1, -1, -1):
            groups = self._sum_groups[level + 1].view(-1, self.fanout)
            n = groups.shape[0]  # the parent level may be padded past its real nodes
            self._sum_levels[level][:n] = groups.sum(1)
            self._min_levels[level][:n] = self._min_groups[level + 1].view(-1, self.fanout).amin(1)
