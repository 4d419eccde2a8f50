"""Typed configs: dataclasses with a default and a one-line help per field.

A run's config is a ``TrainConfig`` whose ``algo_cfg`` is the algorithm's own
dataclass. The same tree is written to ``config.yaml`` and read back; ``--set
key=value`` overrides any leaf by its dotted path (``ppo.lr``, ``env.num_envs``)
or, for algorithm fields, by its bare name (``lr``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from corral.errors import UserError


def option(default: Any, help: str, **kw) -> Any:
    """A config field: a default and a one-line help (shown by ``corral list --options``)."""
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class EnvConfig:
    id: str = option("CartPole-v1", "Gymnasium id, 'module:callable', 'file.py:Name' or a registered name")
    num_envs: int = option(1, "parallel envs for collection")
    backend: str = option("sync", "vector backend: sync (in-process), subproc (worker processes), envpool, native (torch-batched)")
    kwargs: dict = option({}, "keyword arguments passed to the env constructor")
    on_error: str = option("raise", "an env that raises: raise (stop the run) or restart (rebuild it, drop the episode)")
    strict: bool = option(False, "reject out-of-bounds Box actions instead of clipping and counting them")
    atari_wrappers: bool = option(True, "standard Atari preprocessing for ALE ids (evaluation drops episodic life and clipping)")


@dataclass
class EvalConfig:
    every: int = option(0, "evaluate every this many env steps (0: only at the end)")
    episodes: int = option(10, "episodes per evaluation")
    num_envs: int = option(5, "parallel envs for evaluation")
    deterministic: bool = option(True, "use the policy's mode rather than sampling")
    video: bool = option(False, "also show one episode per evaluation as a video in TensorBoard (needs corral[video])")
    stop_at_return: float | None = option(None, "stop training once a periodic evaluation's mean return reaches this")


@dataclass
class CheckpointConfig:
    every: int = option(0, "write a checkpoint every this many env steps (0: only at the end and the best eval)")
    keep: int = option(3, "periodic checkpoints to keep (latest and best are always kept)")


@dataclass
class SchemeConfig:
    collectors: int = option(1, "collection workers (Ray actors when > 1; 1 runs in-process, no Ray)")
    collect: str = option("sync", "sync (wait for every collector each update) or async (use fragments as they arrive)")
    grad_workers: int = option(1, "gradient workers computing on shards of each batch (Ray actors when > 1)")
    grad: str = option("sync", "sync (average gradients, equal to one process) or async (apply as they arrive)")
    ray_address: str | None = option(None, "join an existing Ray cluster (None: start a local one sized to the machine)")
    max_restarts: int = option(10, "times a dead collector is restarted before the run fails")


@dataclass
class TrainConfig:
    algo: str = option("ppo", "algorithm name (`corral list` shows them)")
    env: EnvConfig = option(None, "environment", )
    steps: int = option(100_000, "env steps to train for (summed over envs)")
    seed: int = option(0, "seed for every random stream of the run")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    threads: int = option(1, "torch CPU threads (small nets are fastest on one)")
    stop_at_return: float | None = option(None, "stop when the mean training return of the last 20 episodes reaches this")
    log_every: int = option(2048, "write metrics every this many env steps")
    progress: bool = option(True, "show a progress bar")
    tensorboard: bool = option(True, "write TensorBoard events")
    eval: EvalConfig = option(None, "periodic evaluation")
    checkpoint: CheckpointConfig = option(None, "checkpointing")
    scheme: SchemeConfig = option(None, "where collection and gradient work run (in-process or Ray workers)")
    algo_cfg: Any = option(None, "the algorithm's own config (a dataclass)")

    def __post_init__(self):
        self.env = self.env or EnvConfig()
        self.eval = self.eval or EvalConfig()
        self.checkpoint = self.checkpoint or CheckpointConfig()
        self.scheme = self.scheme or SchemeConfig()


# ---------------------------------------------------------------------------
# Conversion between dataclass trees and plain dicts, with type checks.


def to_dict(cfg: Any) -> dict:
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "algo_cfg":
            out[cfg.algo] = to_dict(v) if v is not None else {}
            continue
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else (list(v) if isinstance(v, tuple) else v)
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; convert the obvious safe cases."""
    if isinstance(tp, str):
        tp = eval(tp, {"Any": Any, "dict": dict, "list": list, "tuple": tuple})  # annotations from __future__
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, key)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0] if errors else f"{key}: bad value {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif origin in (tuple, list) or tp in (tuple, list):
        if isinstance(value, (list, tuple)):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            items = [coerce(v, args[0], key) for v in value] if args else list(value)
            return tuple(items) if (origin is tuple or tp is tuple) else items
    raise UserError(f"config {key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def update_from_dict(cfg: Any, data: dict, prefix: str = "") -> None:
    """Apply a nested dict onto a dataclass tree, checking keys and types."""
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in fields:
            raise UserError(_unknown_key_message(key, all_keys(cfg, prefix)))
        cur = getattr(cfg, k)
        if dataclasses.is_dataclass(cur):
            if not isinstance(v, dict):
                raise UserError(f"config {key}: expected a mapping of its fields, got {v!r}")
            update_from_dict(cur, v, key + ".")
        elif k == "kwargs" and isinstance(cur, dict) and isinstance(v, dict):
            cur.update(v)
        else:
            setattr(cfg, k, coerce(v, hints[k], key))


def all_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        name = f.name
        if f.name == "algo_cfg" and v is not None:
            keys += all_keys(v, f"{prefix}{cfg.algo}.")
            continue
        if dataclasses.is_dataclass(v):
            keys += all_keys(v, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _unknown_key_message(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.4)
    if not close:  # also match on the last component ("lr" vs "ppo.lr")
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in valid if difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1]], cutoff=0.6)][:3]
    hint = f"; nearest valid keys: {', '.join(close)}" if close else "; `corral list --options ALGO` shows every key"
    return f"unknown config key {key!r}{hint}"


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """``["a.b=1", "lr=3e-4"]`` -> ``[("a.b", 1), ("lr", 0.0003)]`` with YAML value parsing."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected key=value, e.g. --set ppo.lr=3e-4")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        # YAML reads "3e-4" as a string; numbers written that way are still numbers.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        out.append((key.strip(), value))
    return out


def apply_set(cfg: TrainConfig, pairs: list[tuple[str, Any]]) -> None:
    valid = all_keys(cfg)
    for key, value in pairs:
        path = key
        if path not in valid and not path.startswith("env.kwargs."):
            # A bare name resolves when exactly one leaf has it (algorithm fields first).
            matches = [k for k in valid if k.rsplit(".", 1)[-1] == key]
            algo_matches = [k for k in matches if k.startswith(cfg.algo + ".")]
            if len(algo_matches) == 1:
                path = algo_matches[0]
            elif len(matches) == 1:
                path = matches[0]
            else:
                raise UserError(_unknown_key_message(key, valid))
        parts = path.split(".")
        target, prefix = cfg, ""
        if parts[0] == cfg.algo and cfg.algo_cfg is not None:
            target, prefix, parts = cfg.algo_cfg, cfg.algo + ".", parts[1:]
        if parts[:2] == ["env", "kwargs"] and len(parts) > 2:
            cfg.env.kwargs[".".join(parts[2:])] = value
            continue
        node = {parts[-1]: value}
        for p in reversed(parts[:-1]):
            node = {p: node}
        update_from_dict(target, node, prefix)


def load_yaml(path: str) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise UserError(f"config file {path!r} does not exist") from None
    except yaml.YAMLError as e:
        raise UserError(f"config file {path!r} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {path!r} must hold a mapping, got {type(data).__name__}")
    return data


def apply_dict(cfg: TrainConfig, data: dict) -> None:
    """Apply a config mapping (from YAML or a preset); the algorithm section is keyed by algo name."""
    data = dict(data)
    data.pop("algo", None)
    algo_section = data.pop(cfg.algo, None)
    if algo_section:
        update_from_dict(cfg.algo_cfg, algo_section, cfg.algo + ".")
    update_from_dict(cfg, data)


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
