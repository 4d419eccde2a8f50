"""Published results of the systems corral is compared with, read from ``peers.yaml``.

``load_peers()`` reads the table shipped with the package (or a file given), checks every entry
and returns a :class:`PeerTable`; ``table.published(env, algo, steps)`` gives the figures a report
may quote for a cell: the same env id (version included), the same algorithm, and a budget at or
below the cell's.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from corral.errors import UserError

KINDS = ("eval", "train")
SOURCE_FIELDS = ("title", "url", "version", "kind", "protocol")
ENTRY_FIELDS = ("source", "algo", "env", "steps", "seeds", "value")
OPTIONAL_FIELDS = ("std", "note", "kind")


@dataclass(frozen=True)
class Peer:
    """One published figure: ``value`` (± ``std``) for ``algo`` on ``env`` after ``steps`` agent
    steps, averaged over ``seeds`` runs, with where it comes from."""

    source: str
    algo: str
    env: str
    steps: int
    seeds: int
    value: float
    std: float | None
    kind: str
    note: str | None
    title: str
    url: str
    version: str
    protocol: str

    def describe(self) -> str:
        """Short text, e.g. ``rl-zoo 500.0 ± 0.0 (1 seed, 100k steps, eval)``."""
        spread = f" ± {self.std}" if self.std is not None else ""
        seeds = f"{self.seeds} seed" + ("" if self.seeds == 1 else "s")
        return f"{self.source} {self.value}{spread} ({seeds}, {_short(self.steps)} steps, {self.kind})"


def _short(steps: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if steps >= size and steps % (size // 10) == 0:
            return f"{steps / size:g}{unit}"
    return str(steps)


class PeerTable:
    """The checked entries of a peers file."""

    def __init__(self, sources: dict[str, dict], peers: list[Peer]):
        self.sources = sources  # key -> {"title", "url", "version", "kind", "protocol"}
        self.peers = peers

    def __len__(self) -> int:
        return len(self.peers)

    def envs(self) -> list[str]:
        """The env ids with at least one published figure, sorted."""
        return sorted({p.env for p in self.peers})

    def published(self, env: str, algo: str | None = None, steps: int | None = None,
                  sources: list[str] | None = None) -> list[Peer]:
        """The figures for exactly ``env`` (``LunarLander-v2`` is not ``LunarLander-v3``), for
        ``algo`` if given, with a budget of at most ``steps`` if given (a 1M-step figure is not
        quoted for a 500k cell), from ``sources`` if given; sorted by source then steps."""
        if sources is not None:
            unknown = sorted(set(sources) - set(self.sources))
            if unknown:
                raise UserError(f"unknown peer source(s) {unknown}; known: {sorted(self.sources)}")
        found = [p for p in self.peers
                 if p.env == env
                 and (algo is None or p.algo == algo)
                 and (steps is None or p.steps <= steps)
                 and (sources is None or p.source in sources)]
        return sorted(found, key=lambda p: (p.source, p.steps))


def load_peers(path: str | Path | None = None) -> PeerTable:
    """Read and check a peers file (default: the one shipped as ``corral/bench/peers.yaml``).
    A malformed file raises :class:`UserError` naming the entry and the field."""
    if path is None:
        text = resources.files("corral.bench").joinpath("peers.yaml").read_text(encoding="utf-8")
        where = "corral/bench/peers.yaml"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot read peers file {path}: {e}") from e
        where = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"{where}: not valid YAML: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict) \
            or not isinstance(data.get("results"), list):
        raise UserError(f"{where}: needs a 'sources' mapping and a 'results' list")
    sources = {key: _check_source(where, key, src) for key, src in data["sources"].items()}
    peers = [_check_entry(where, i, e, sources) for i, e in enumerate(data["results"])]
    return PeerTable(sources, peers)


def _check_source(where: str, key, src) -> dict:
    name = f"{where}: source {key!r}"
    if not isinstance(src, dict):
        raise UserError(f"{name}: must be a mapping with {', '.join(SOURCE_FIELDS)}")
    for field in SOURCE_FIELDS:
        if not isinstance(src.get(field), str) or not src[field].strip():
            raise UserError(f"{name}: field '{field}' is missing or not a non-empty string")
    if src["kind"] not in KINDS:
        raise UserError(f"{name}: field 'kind' is {src['kind']!r}, not one of {KINDS}")
    return {field: src[field] for field in SOURCE_FIELDS}


def _check_entry(where: str, i: int, e, sources: dict[str, dict]) -> Peer:
    if not isinstance(e, dict):
        raise UserError(f"{where}: results entry {i} is not a mapping")
    name = f"{where}: results entry {i} ({e.get('source')} {e.get('algo')} {e.get('env')})"

    def bad(field: str, why: str) -> UserError:
        return UserError(f"{name}: field '{field}' {why}")

    for field in ENTRY_FIELDS:
        if field not in e:
            raise bad(field, "is missing")
    extra = sorted(set(e) - set(ENTRY_FIELDS) - set(OPTIONAL_FIELDS))
    if extra:
        raise bad(extra[0], f"is not known (fields: {', '.join(ENTRY_FIELDS + OPTIONAL_FIELDS)})")
    if e["source"] not in sources:
        raise bad("source", f"is {e['source']!r}, not one of the sources {sorted(sources)}")
    for field in ("algo", "env"):
        if not isinstance(e[field], str) or not e[field]:
            raise bad(field, "must be a non-empty string")
    for field in ("steps", "seeds"):
        if isinstance(e[field], bool) or not isinstance(e[field], int) or e[field] < 1:
            raise bad(field, f"must be a positive integer, got {e[field]!r}")
    for field in ("value", "std"):
        v = e.get(field)
        if field == "std" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise bad(field, f"must be a number, got {v!r}")
    if e.get("std") is not None and e["std"] < 0:
        raise bad("std", f"must be >= 0, got {e['std']!r}")
    if e.get("note") is not None and not isinstance(e["note"], str):
        raise bad("note", "must be a string")
    src = sources[e["source"]]
    kind = e.get("kind", src["kind"])
    if kind not in KINDS:
        raise bad("kind", f"is {kind!r}, not one of {KINDS}")
    return Peer(source=e["source"], algo=e["algo"], env=e["env"], steps=e["steps"], seeds=e["seeds"],
                value=float(e["value"]), std=None if e.get("std") is None else float(e["std"]),
                kind=kind, note=e.get("note"), title=src["title"], url=src["url"],
                version=src["version"], protocol=src["protocol"])
