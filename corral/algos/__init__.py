"""Algorithm registry: a name maps to an Algorithm class plus config overrides, so a
variant (e.g. ``double_dqn``) is a preset of one readable algorithm, not a copy."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from corral.algos.base import Algorithm
from corral.algos.ppo import PPO, PPOConfig
from corral.errors import UserError


@dataclass
class AlgoSpec:
    cls: type[Algorithm]
    overrides: dict[str, Any] = field(default_factory=dict)
    help: str = ""


ALGOS: dict[str, AlgoSpec] = {
    "ppo": AlgoSpec(PPO, help="Proximal Policy Optimization (discrete and continuous)"),
}


def register_algo(name: str, cls: type[Algorithm], overrides: dict | None = None, help: str = "") -> None:
    ALGOS[name] = AlgoSpec(cls, dict(overrides or {}), help)


def get_algo(name: str) -> AlgoSpec:
    try:
        return ALGOS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(ALGOS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(sorted(ALGOS))}"
        raise UserError(f"unknown algorithm {name!r}{hint}") from None


__all__ = ["ALGOS", "AlgoSpec", "Algorithm", "PPO", "PPOConfig", "get_algo", "register_algo"]
