"""Search spaces over config keys: ``ppo.lr=loguniform:1e-4:1e-2``, ``ppo.n_epochs=choice:4,10``,
``ppo.gamma=uniform:0.95:0.999``, ``ppo.batch_size=randint:32:256`` (low and high included), given
on the command line (``--space``) or in YAML (``{ppo.lr: "loguniform:1e-4:1e-2"}``). A
dimension samples, perturbs (PBT's explore) and becomes a Ray Tune domain."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import yaml

from corral.errors import UserError

KINDS = ("loguniform", "uniform", "randint", "choice")


@dataclass(frozen=True)
class Dim:
    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()

    def sample(self, rng: random.Random) -> Any:
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        if self.kind == "randint":
            return rng.randint(int(self.low), int(self.high))
        return rng.choice(self.choices)

    def perturb(self, value: Any, rng: random.Random, factors: tuple[float, float] = (0.8, 1.2)) -> Any:
        """PBT's perturbation: a number times one of ``factors`` (kept within the bounds); a
        choice moves to a neighbouring one."""
        if self.kind == "choice":
            i = self.choices.index(value) if value in self.choices else 0
            j = min(max(i + rng.choice((-1, 1)), 0), len(self.choices) - 1)
            return self.choices[j]
        out = min(max(value * rng.choice(factors), self.low), self.high)
        return int(round(out)) if self.kind == "randint" else out

    def to_tune(self):
        from ray import tune

        if self.kind == "loguniform":
            return tune.loguniform(self.low, self.high)
        if self.kind == "uniform":
            return tune.uniform(self.low, self.high)
        if self.kind == "randint":
            return tune.randint(int(self.low), int(self.high) + 1)  # Tune's upper bound is exclusive
        return tune.choice(list(self.choices))

    def text(self) -> str:
        if self.kind == "choice":
            return "choice:" + ",".join(map(str, self.choices))
        return f"{self.kind}:{self.low:g}:{self.high:g}"


def parse_dim(key: str, spec: Any) -> Dim:
    """One dimension from ``kind:args`` (or a YAML list, read as a choice)."""
    if isinstance(spec, (list, tuple)):
        return Dim(key, "choice", choices=tuple(spec))
    text = str(spec)
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise UserError(f"search space {key}={text!r}: use one of {', '.join(k + ':...' for k in KINDS)} "
                        "(e.g. loguniform:1e-4:1e-2, choice:4,10)")
    if kind == "choice":
        choices = tuple(yaml.safe_load(c) for c in rest.split(",") if c != "")
        if not choices:
            raise UserError(f"search space {key}={text!r}: give the choices, e.g. choice:4,10")
        return Dim(key, kind, choices=choices)
    parts = rest.split(":")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise UserError(f"search space {key}={text!r}: {kind} takes two numbers, {kind}:LOW:HIGH") from None
    if not low < high or (kind == "loguniform" and low <= 0):
        raise UserError(f"search space {key}={text!r}: need LOW < HIGH{' and LOW > 0' if kind == 'loguniform' else ''}")
    return Dim(key, kind, low, high)


def parse_space(items: list[str] | dict | None) -> dict[str, Dim]:
    """``["ppo.lr=loguniform:1e-4:1e-2", ...]`` or ``{"ppo.lr": "loguniform:1e-4:1e-2"}``."""
    if not items:
        return {}
    if isinstance(items, dict):
        return {k: parse_dim(k, v) for k, v in items.items()}
    out = {}
    for item in items:
        key, eq, spec = item.partition("=")
        if not eq or not key:
            raise UserError(f"--space {item!r}: write KEY=KIND:ARGS, e.g. ppo.lr=loguniform:1e-4:1e-2")
        out[key.strip()] = parse_dim(key.strip(), spec.strip())
    return out


def load_space_file(path: str) -> dict[str, Dim]:
    from corral import config as C

    data = C.load_yaml(path)
    return parse_space(data.get("space", data))


def check_keys(space: dict[str, Dim], algo: str, env: Any) -> None:
    """Every key names a config option (one error naming the bad key before any trial starts)."""
    from corral.train.setup import build_config

    for key, dim in space.items():
        build_config(algo, env, overrides={key: dim.sample(random.Random(0))})
