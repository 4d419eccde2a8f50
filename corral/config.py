"""Typed configs: dataclasses with a default, a one-line help and a valid range per field.

A run's config is a ``TrainConfig`` whose ``algo_cfg`` is the algorithm's own
dataclass. The same tree is written to ``config.yaml`` and read back; ``--set
key=value`` overrides any leaf by its dotted path (``ppo.lr``, ``env.num_envs``)
or, for algorithm fields, by its bare name (``lr``).

Every value is checked where it is set (presets, ``--config`` files, ``--set``, Python
overrides): its type, ``Literal`` choices and numeric range, so a bad value fails
before anything is built, with the key named. Keys that Stable-Baselines3 and RLlib
users bring (``learning_rate``, ``num_sgd_iter``, ...) resolve through ``ALIASES``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import yaml

from corral.config_aliases import ALIAS_NOTES as ALIAS_NOTES  # noqa: F401 - re-exported
from corral.config_aliases import ALIASES as ALIASES  # noqa: F401 - re-exported
from corral.config_aliases import _alias_note, _unknown_key_message, resolve_alias
from corral.errors import UserError


def option(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, also: tuple = (), pattern: str | None = None,
           **kw) -> Any:
    """A config field: a default, a one-line help (shown by ``corral list --options``) and,
    for numbers, a valid range: ``ge``/``gt`` and ``le``/``lt`` bounds (applied to each
    item of a tuple), plus ``also``, values outside the range with a meaning of their own
    (``gradient_steps=-1``). ``pattern``: a regular expression a string value must match
    whole (the help says what it admits). ``None`` always passes where the type allows it."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    metadata = {"help": help, "range": bounds, "also": tuple(also), "pattern": pattern}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


# Closed sets of strings, shared by the configs that take them.
Activation = Literal["tanh", "relu", "elu", "silu"]
Schedule = Literal["constant", "linear"]
SyncOrAsync = Literal["sync", "async"]


@dataclass
class EnvConfig:
    id: str = option("CartPole-v1", "Gymnasium id, 'module:callable', 'file.py:Name' or a registered name")
    num_envs: int = option(1, "parallel envs for collection", ge=1)
    backend: Literal["sync", "subproc", "envpool", "native"] = option(
        "sync", "vector backend: sync (in-process), subproc (worker processes), envpool, native (torch-batched)")
    kwargs: dict = option({}, "keyword arguments passed to the env constructor")
    on_error: Literal["raise", "restart"] = option(
        "raise", "an env that raises: raise (stop the run) or restart (rebuild it, drop the episode)")
    strict: bool = option(False, "reject out-of-bounds Box actions instead of clipping and counting them")
    atari_wrappers: bool = option(True, "standard Atari preprocessing for ALE ids (evaluation drops episodic life and clipping)")
    mask_obs: tuple[int, ...] | None = option(
        None, "zero these entries of a Box observation, e.g. [1, 3] hides CartPole's velocities (as CartPoleNoVel-v1)")
    wrappers: list = option(
        [], "Gymnasium wrappers around each env, innermost first: import paths (minigrid.wrappers.FlatObsWrapper) "
            "or {path: {argument: value}} (rl-zoo's env_wrapper; corral/envs/wrapped.py)")
    opponents: tuple[str, ...] = option(
        (), "multi-agent envs: agents (names or patterns such as adversary_*) that act at random and are not "
            "trained, a fixed opponent (corral/envs/opponents.py)")
    repeat_action_probability: float | None = option(
        None, "Atari sticky actions: the chance the previous action repeats (None: the game's own, 0.25 in ALE v5)",
        ge=0, le=1)
    pixels: dict = option(
        {}, "multi-agent envs whose agents observe images (PettingZoo's butterfly): {size: 84, grey: true, stack: 4}, "
            "frames resized to size x size, grey, the last `stack` stacked, stored as uint8 (docs/multiagent.md)")


@dataclass
class EvalConfig:
    every: int = option(0, "evaluate every this many env steps (0: only at the end)", ge=0)
    episodes: int = option(10, "episodes per evaluation (0: no evaluation at the end)", ge=0)
    num_envs: int = option(5, "parallel envs for evaluation", ge=1)
    deterministic: bool = option(True, "use the policy's mode rather than sampling")
    epsilon: float | None = option(
        None, "act at random with this chance, from the eval_action stream (None: 0.05 for value methods on "
              "Atari, else 0)", ge=0, le=1)
    max_episode_steps: int | None = option(
        None, "end an evaluation episode after this many agent steps (None: Atari's 108,000 frames, "
              "27,000 steps at frame skip 4; elsewhere the env's own limit)", ge=1)
    max_seconds: float | None = option(
        None, "stop an evaluation after this many seconds and report the episodes finished (None: no limit)", gt=0)
    video: bool = option(False, "also show one episode per evaluation as a video in TensorBoard (needs corral[video])")
    stop_at_return: float | None = option(None, "stop training once a periodic evaluation's mean return reaches this")


@dataclass
class CheckpointConfig:
    every: int = option(0, "write a checkpoint every this many env steps (0: only at the end and the best eval)", ge=0)
    keep: int = option(3, "periodic checkpoints to keep (latest and best are always kept)", ge=0)


@dataclass
class SchemeConfig:
    collectors: int = option(1, "collection workers (Ray actors when > 1; 1 runs in-process, no Ray)", ge=1)
    collect: SyncOrAsync = option(
        "sync", "sync (wait for every collector each update) or async (use fragments as they arrive)")
    grad_workers: int = option(1, "gradient workers computing on shards of each batch (Ray actors when > 1)", ge=1)
    grad: SyncOrAsync = option("sync", "sync (average gradients, equal to one process) or async (apply as they arrive)")
    ray_address: str | None = option(None, "join an existing Ray cluster (None: start a local one sized to the machine)")
    max_restarts: int = option(10, "times a dead collector is restarted before the run fails", ge=0)
    max_replay_restarts: int = option(3, "times a dead replay server (Ape-X, R2D2) is restarted from the last "
                                         "checkpoint before the run fails", ge=0)
    max_grad_restarts: int = option(3, "times dead gradient workers are restarted (their step redone) before "
                                       "the run fails", ge=0)
    collector_resources: dict = option(
        {}, "custom Ray resources each collector asks for, e.g. {collector_slot: 1}: collectors (and their "
            "restarts) go only to nodes that offer them (placement on a cluster; docs/distributed.md)")
    grad_resources: dict = option({}, "custom Ray resources each gradient worker asks for (as collector_resources)")
    replay_resources: dict = option({}, "custom Ray resources the replay server asks for (as collector_resources)")
    backend: Literal["ray", "local"] = option(
        "ray", "where collectors and gradient workers run when there are several: ray (Ray actors), or local "
               "(in this process, one after another: the same results as Ray's sync mode, for debugging)")


@dataclass
class LogConfig:
    """What a run writes besides ``metrics.jsonl`` and TensorBoard's scalars (docs/logging.md)."""

    tag: str | None = option(None, "a name for the run, added to the run directory's name and recorded in "
                                   "TensorBoard and the config: letters, digits, '.', '_', '-' (starting with a "
                                   "letter or digit, at most 64), e.g. --tag lr3e-4",
                             pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
    screenshot_every: int = option(0, "a TensorBoard image of the terminal state every this many episodes of "
                                      "env 0 (0: off; needs an env with rgb_array rendering)", ge=0)
    monitor_csv: bool = option(False, "write monitor/<env index>.monitor.csv per env: one row per episode "
                                      "(return, length, time), as Stable-Baselines3's Monitor")
    monitor_dir: str | None = option(None, "where log.monitor_csv writes (None: <run_dir>/monitor); with a folder "
                                           "given, runs without a run directory write them too")
    mlflow: bool = option(False, "also log the metrics to MLflow (needs corral[mlflow])")
    mlflow_uri: str | None = option(None, "MLflow tracking URI (None: a local file store, <runs root>/mlruns)")
    wandb: bool = option(False, "also log the metrics to Weights & Biases (needs corral[wandb])")
    wandb_mode: Literal["offline", "online", "disabled"] = option(
        "offline", "W&B mode: offline (files in the run directory, `wandb sync` later), online, disabled")
    wandb_project: str = option("corral", "W&B project name")


@dataclass
class TrainConfig:
    algo: str = option("ppo", "algorithm name (`corral list` shows them)")
    imports: tuple[str, ...] = option((), "modules (or path/file.py) imported before the run, where the run's "
                                          "workers start too: they may register algorithms (corral.register_algo) "
                                          "and envs (corral.register)")
    env: EnvConfig = option(None, "environment")
    steps: int = option(100_000, "env steps to train for (summed over envs)", ge=1)
    seed: int = option(0, "seed for every random stream of the run", ge=0)
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    threads: int = option(1, "torch CPU threads (small nets are fastest on one)", ge=1)
    matmul: Literal["float32", "bfloat16"] = option(
        "float32", "precision of the updates' wide matmuls (hidden-to-hidden layers): bfloat16 multiplies them in "
                   "bfloat16 with float32 weights, outputs, losses and optimizer, about 2x the matmul speed on a CPU "
                   "with AVX512-BF16 or AMX (refused on one without); acting and evaluation stay float32")
    compile: bool = option(
        False, "torch.compile the update's fused kernels (the quantile Huber loss of TQC, QR-DQN and IQN: ~8x "
               "faster, ~15% of a TQC step on a CPU); ~30-60 s of compiling when the run starts, so it pays on runs "
               "of ~50k steps or more; needs a C++ compiler (CPU) or Triton (GPU)")
    keep_heap: bool = option(True, "glibc: freed memory stays in the process heap (mallopt, process-wide) so "
                                   "a step's activations are not page-faulted in afresh every gradient step")
    stop_at_return: float | None = option(None, "stop when the mean training return of the last 20 episodes reaches this")
    log_every: int = option(2048, "write metrics every this many env steps", ge=1)
    progress: bool = option(True, "show a progress bar")
    tensorboard: bool = option(True, "write TensorBoard events")
    eval: EvalConfig = option(None, "periodic evaluation")
    checkpoint: CheckpointConfig = option(None, "checkpointing")
    scheme: SchemeConfig = option(None, "where collection and gradient work run (in-process or Ray workers)")
    log: LogConfig = option(None, "run tag, screenshots, Monitor CSV, MLflow and W&B")
    algo_cfg: Any = option(None, "the algorithm's own config (a dataclass)")

    def __post_init__(self):
        self.env = self.env or EnvConfig()
        self.eval = self.eval or EvalConfig()
        self.checkpoint = self.checkpoint or CheckpointConfig()
        self.scheme = self.scheme or SchemeConfig()
        self.log = self.log or LogConfig()


# ---------------------------------------------------------------------------
# Conversion between dataclass trees and plain dicts, with type checks.


def to_dict(cfg: Any) -> dict:
    out: dict[str, Any] = {}
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
        args: tuple[Any, ...] | list[Any] = typing.get_args(tp)
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
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices and type(value) is type(choices[0]):
            return value
        names = [str(c) for c in choices]
        nearest = difflib.get_close_matches(str(value), names, n=1, cutoff=0.0)
        raise UserError(f"config {key}: {value!r} is not one of {', '.join(names)}"
                        + (f"; did you mean {nearest[0]!r}?" if nearest else ""))
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
        qualname = getattr(value, "__qualname__", "")
        if callable(value) and getattr(value, "__module__", None) and qualname and "<locals>" not in qualname:
            return f"{value.__module__}:{qualname}"  # a class or function where a 'module:callable' is taken
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif origin in (tuple, list) or tp in (tuple, list):
        if isinstance(value, (list, tuple)):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            items = [coerce(v, args[0], key) for v in value] if args else list(value)
            return tuple(items) if (origin is tuple or tp is tuple) else items
    raise UserError(f"config {key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _range_text(bounds: dict, also: tuple) -> str:
    lo = next(((k, v) for k, v in bounds.items() if k in ("ge", "gt")), None)
    hi = next(((k, v) for k, v in bounds.items() if k in ("le", "lt")), None)
    if lo and hi:
        text = f"in {'[' if lo[0] == 'ge' else '('}{lo[1]:g}, {hi[1]:g}{']' if hi[0] == 'le' else ')'}"
    else:
        op, v = cast("tuple[str, float]", lo or hi)  # bounds has one of them
        text = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op] + f" {v:g}"
    return text + (f" (or {', '.join(map(str, also))})" if also else "")


def describe(f: dataclasses.Field) -> str:
    """A field's help with its valid range, as ``corral list --options`` shows it."""
    bounds = f.metadata.get("range")
    text = f.metadata.get("help", "")
    return f"{text} [{_range_text(bounds, f.metadata.get('also', ()))}]" if bounds else text


def check_range(value: Any, f: dataclasses.Field, key: str) -> None:
    """Raise a ``UserError`` when a number (or a tuple item) is outside field ``f``'s range."""
    bounds, also = f.metadata.get("range"), f.metadata.get("also", ())
    pattern = f.metadata.get("pattern")
    if pattern and isinstance(value, str) and not re.fullmatch(pattern, value):
        raise UserError(f"config {key}: {value!r} is not allowed; {f.metadata['help']}")
    if not bounds or value is None:
        return
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v in also:
            continue
        ok = all({"ge": v >= b, "gt": v > b, "le": v <= b, "lt": v < b}[op] for op, b in bounds.items())
        if not ok:  # NaN fails every comparison, so it lands here too
            raise UserError(f"config {key}: {value!r} is out of range; it must be {_range_text(bounds, also)}")


def check_config(cfg: Any, prefix: str = "") -> None:
    """Check every leaf of a dataclass tree against its type and range (the defaults of a
    newly written Config, say; values set through this module are checked as they come)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "algo_cfg":
            if v is not None:
                check_config(v, f"{prefix}{cfg.algo}.")
        elif dataclasses.is_dataclass(v):
            check_config(v, f"{prefix}{f.name}.")
        else:
            check_range(coerce(v, hints[f.name], prefix + f.name), f, prefix + f.name)


def update_from_dict(cfg: Any, data: dict, prefix: str = "") -> None:
    """Apply a nested dict onto a dataclass tree, checking keys, types and ranges; a key
    from another library resolves through ``ALIASES``."""
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for k, v in data.items():
        if k not in fields:
            target = resolve_alias(k, cfg) or ""
            if "." in target and target.startswith(prefix):  # a section's own key (env.num_envs in env:)
                target = target[len(prefix):]
            if target not in fields:
                raise UserError(_unknown_key_message(prefix + k, all_keys(cfg, prefix), cfg))
            _alias_note(prefix + k, prefix + target)
            k = target
        key = f"{prefix}{k}"
        cur = getattr(cfg, k)
        if dataclasses.is_dataclass(cur):
            if not isinstance(v, dict):
                raise UserError(f"config {key}: expected a mapping of its fields, got {v!r}")
            update_from_dict(cur, v, key + ".")
        elif k == "kwargs" and isinstance(cur, dict) and isinstance(v, dict):
            cur.update(v)
        else:
            value = coerce(v, hints[k], key)
            check_range(value, fields[k], key)
            setattr(cfg, k, value)


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


# ---------------------------------------------------------------------------
# Keys from other libraries: corral/config_aliases.py (ALIASES, resolve_alias), re-exported here.


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


def resolve_key(cfg: TrainConfig, key: str, valid: list[str] | None = None) -> str:
    """The dotted path ``key`` names: itself, a bare field name, or another library's name."""
    valid = all_keys(cfg) if valid is None else valid
    if key in valid or key.startswith(("env.kwargs.", "env.pixels.")):
        return key
    section, _, leaf = key.rpartition(".")
    if section and f"{cfg.algo}.{leaf}" in valid and section in _family(cfg.algo):
        return f"{cfg.algo}.{leaf}"  # the family's section name: ppo.recurrent for ppo_lstm, dqn.lr for d3qn
    path = _bare_key(cfg, key, valid)
    target = resolve_alias(leaf, cfg.algo_cfg)
    if path is None and target is not None:
        if "." in target:
            path = target if target in valid else None
        elif section:
            path = f"{section}.{target}" if f"{section}.{target}" in valid else None
        else:
            path = _bare_key(cfg, target, valid)
        if path is not None:
            _alias_note(key, path)
    if path is None:
        raise UserError(_unknown_key_message(key, valid, cfg.algo_cfg))
    return path


# Per registered algorithm, the names of the classes it is built on (``ppo_lstm``: ppo_lstm,
# ppo); filled by the registry (``corral.algos``), so ``ppo.recurrent`` resolves for ppo_lstm.
ALGO_FAMILIES: dict[str, set[str]] = {}


def _family(algo: str) -> set[str]:
    return ALGO_FAMILIES.get(algo, set())


def _bare_key(cfg: TrainConfig, name: str, valid: list[str]) -> str | None:
    """A bare name resolves when exactly one leaf has it (algorithm fields first)."""
    matches = [k for k in valid if k.rsplit(".", 1)[-1] == name]
    algo_matches = [k for k in matches if k.startswith(cfg.algo + ".")]
    if len(algo_matches) == 1:
        return algo_matches[0]
    return matches[0] if len(matches) == 1 else None


def apply_set(cfg: TrainConfig, pairs: list[tuple[str, Any]]) -> None:
    valid = all_keys(cfg)
    for key, value in pairs:
        parts = resolve_key(cfg, key, valid).split(".")
        target, prefix = cfg, ""
        if parts[0] == cfg.algo and cfg.algo_cfg is not None:
            target, prefix, parts = cfg.algo_cfg, cfg.algo + ".", parts[1:]
        if parts[:2] in (["env", "kwargs"], ["env", "pixels"]) and len(parts) > 2:
            getattr(cfg.env, parts[1])[".".join(parts[2:])] = value  # one entry of the mapping
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
