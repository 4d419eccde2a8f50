"""What a key's mapping in :mod:`corral.zoo`'s table works with: ``Refused`` (a key corral
cannot honour, with the reason), ``Context`` (the algorithm, the env, the whole entry) and the
mappings built from a name (``_same``, ``_schedule``, ``_refuse``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from corral.zoo.literal import parse_schedule


class Refused(Exception):
    """A key corral cannot honour; the message is the reason (and the fix where there is one)."""


@dataclass
class Context:
    """What a key's mapping may look at: the algorithm (name and config class), the env, the
    whole entry (keys that go in pairs, such as noise_type and noise_std)."""

    algo: str
    algo_cfg: Any
    env_id: str
    is_atari: bool
    entry: dict
    refused: dict = field(default_factory=dict)  # sub-keys refused by a key that is otherwise taken

    def has(self, name: str) -> bool:
        return any(f.name == name for f in dataclasses.fields(self.algo_cfg))

    def field(self, name: str, why: str = "") -> str:
        """``<algo>.<name>``, or Refused when the algorithm has no such field."""
        if not self.has(name):
            raise Refused(why or f"{self.algo} in corral has no {name!r}")
        return f"{self.algo}.{name}"


Pairs = list[tuple[str, Any]]


def _same(name: str, target: str | None = None) -> Callable[[Any, Context], Pairs]:
    """A key corral has under this name (or ``target``) in the algorithm's section."""
    def fn(value: Any, ctx: Context) -> Pairs:
        return [(ctx.field(target or name), value)]
    fn.__doc__ = f"{target or name}"
    return fn


def _schedule(value_key: str, schedule_key: str | None) -> Callable[[Any, Context], Pairs]:
    def fn(value: Any, ctx: Context) -> Pairs:
        kind, x = parse_schedule(value, value_key)
        if value_key == "clip_range_vf" and kind == "constant" and x < 0:
            return [(ctx.field(value_key), None)]  # rl-zoo: a negative clip means none
        pairs = [(ctx.field(value_key), x)]
        if schedule_key is not None and ctx.has(schedule_key):
            pairs.append((ctx.field(schedule_key), kind))
        elif kind == "linear":
            raise Refused(f"{ctx.algo} in corral has no linear schedule for {value_key}; write a constant")
        return pairs
    fn.__doc__ = f"{value_key}" + (f" and {schedule_key} (lin_X: linear)" if schedule_key else "")
    return fn


def _refuse(reason: str) -> Callable[[Any, Context], Pairs]:
    def fn(value: Any, ctx: Context) -> Pairs:
        raise Refused(reason)
    fn.__doc__ = f"refused: {reason}"
    return fn


def _refuse_if_set(doc: str, reason: str) -> Callable[[Any, Context], Pairs]:
    """A switch corral does not have: nothing to set when false (SB3's default), else refused."""
    def fn(value: Any, ctx: Context) -> Pairs:
        if not value:
            return []
        raise Refused(reason)
    fn.__doc__ = doc
    return fn
