"""Running observation normalizer. Its statistics are buffers, so they live in the
actor's ``state_dict`` and travel with every checkpoint and parameter broadcast."""

from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    """(x - mean) / sqrt(var + eps), clipped; statistics updated only in train mode.

    Uses the parallel mean/variance merge (Chan et al.), so statistics from
    several envs or workers combine exactly: ``merge(count, mean, var)``.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, enabled: bool = True):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0.0, dtype=torch.float64))
        # float32 copies for the hot path, refreshed whenever the statistics change
        self.register_buffer("_mean32", torch.zeros(shape), persistent=False)
        self.register_buffer("_std32", torch.ones(shape), persistent=False)
        # Device-resident runs (``defer_checks``) fold batches without a host read: a non-finite
        # input is remembered here and reported by ``check_finite`` (once per update).
        self.defer_checks = False
        self._nonfinite: torch.Tensor | None = None  # not a buffer: no state, nothing to sync
        # Set by actors of Dict / Tuple observations: the column of each slot in the older flat
        # layout (integer parts one-hot) and that layout's width, so statistics saved by an
        # older corral still load (``corral.envs.spaces.legacy_columns``).
        self.legacy: tuple[list[int], int] | None = None
        self._refresh()

    def _refresh(self) -> None:
        self._mean32.copy_(self.mean)
        self._std32.copy_((self.var + self.eps).sqrt())

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.legacy is not None:
            cols, width = self.legacy
            for name in ("mean", "var"):
                old = state_dict.get(prefix + name)
                if old is not None and old.dim() == 1 and old.shape[0] == width != self.mean.shape[0]:
                    state_dict[prefix + name] = old[cols]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._refresh()

    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[B, *shape]`` into the statistics (no-op in eval mode)."""
        if not (self.enabled and self.training):
            return
        with torch.no_grad():
            self._update(x)

    def _update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        if self.defer_checks:
            bad = ~torch.isfinite(x).all()
            if self._nonfinite is None:
                self._nonfinite = bad
            else:
                self._nonfinite.logical_or_(bad)  # in place: no new flag tensor per step
        elif not torch.isfinite(x).all():
            raise ValueError(self.NONFINITE)
        self.merge(self._count_of(x.shape[0]), x.mean(0), x.var(0, unbiased=False))

    def _count_of(self, n: int) -> torch.Tensor:
        """A batch size as a float64 tensor on the statistics' device, made once per size (a
        fresh one per step would be a host-to-device copy per step)."""
        counts = self.__dict__.setdefault("_counts", {})
        key = (n, self.count.device)
        if key not in counts:
            counts[key] = torch.tensor(float(n), dtype=torch.float64, device=self.count.device)
        return counts[key]

    NONFINITE = ("observation normalizer got a non-finite value; check the env's observations "
                 "(corral refuses to fold NaN/inf into the running statistics)")

    def check_finite(self) -> None:
        """Raise if a deferred check saw a non-finite input (one host read)."""
        if self.defer_checks and self._nonfinite is not None and bool(self._nonfinite):
            raise ValueError(self.NONFINITE)

    @torch.no_grad()
    def merge(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        count = torch.as_tensor(count, dtype=torch.float64, device=self.count.device)
        total = self.count + count
        delta = mean.to(self.mean) - self.mean
        new_mean = self.mean + delta * (count / total)
        m2 = self.var * self.count + var.to(self.var) * count + delta.square() * self.count * count / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self._refresh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x.float() if not x.is_floating_point() else x
        return ((x.float() - self._mean32) / self._std32).clamp(-self.clip, self.clip)


def normalizers(*modules: nn.Module) -> list[RunningNormalizer]:
    """Every running normalizer in ``modules``, in a fixed (registration) order."""
    return [m for module in modules for m in module.modules() if isinstance(m, RunningNormalizer)]
