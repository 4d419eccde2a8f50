"""The in-process pool of collectors (``LocalPool``: tests, debugging; ``RayPool`` is its Ray
twin in ``corral.schemes.ray_scheme``) and the failure it reports."""

from __future__ import annotations

from typing import Any

from corral.schemes.collector import Collector, FragmentData, driver_paths


class CollectorFailed(Exception):
    """A collector task failed; ``cause`` is what it raised (or why its process died)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class LocalPool:
    """Collectors in this process, run one at a time when waited on. Same interface as
    ``RayPool``: ``submit``, ``wait``, ``get``, ``restart``, ``put``, ``close``."""

    def __init__(self, cfg, env_spec, num_workers: int, inits: list | None = None):
        self.cfg, self.env_spec, self.num_workers = cfg, env_spec, num_workers
        self.generations = [0] * num_workers
        inits = inits or [None] * num_workers
        self.collectors = [self._make(k, inits[k]) for k in range(num_workers)]
        self.pending: list[tuple[int, tuple]] = []

    def _make(self, k: int, init: dict | None = None) -> Collector:
        return Collector(self.cfg, self.env_spec, k, self.num_workers, self.generations[k], driver_paths(), init)

    def spaces(self):
        return self.collectors[0].spaces()

    def submit(self, k: int, params: Any, version: int, env_steps: int, want_state: bool = False) -> None:
        self.pending.append((k, (params, version, env_steps, want_state)))

    def wait(self, timeout: float | None = None) -> list:
        if not self.pending:
            return []
        k, args = self.pending.pop(0)
        try:
            meta, data = self.collectors[k].collect(*args)
        except Exception as e:  # noqa: BLE001 - any failure of a collector is restartable
            return [(k, None, None, CollectorFailed(e))]
        return [(k, meta, data, None)]

    def get(self, data: FragmentData) -> FragmentData:
        return data

    def put(self, state: dict) -> dict:
        return state

    def restart(self, k: int) -> None:
        self.collectors[k].close()
        self.generations[k] += 1
        self.collectors[k] = self._make(k)

    def in_flight(self) -> int:
        return len(self.pending)

    def close(self) -> None:
        for c in self.collectors:
            c.close()
