"""rl-zoo's hyperparameter files as a config source (``--config hyperparams/ppo.yml``, ``--zoo``).

rl-zoo (rl_zoo3) keeps its tuned hyperparameters in one YAML file per algorithm, one
top-level key per env id plus a ``default`` and an ``atari`` entry, in Stable-Baselines3's
names: ``learning_rate: lin_0.001`` schedules, ``n_timesteps``, ``n_envs``, ``normalize``
(VecNormalize), ``policy_kwargs`` written as a Python expression, ``env_wrapper``,
``frame_stack``, ``policy``. This module reads such a file's entry for one env and maps
every key to corral's config; a key corral cannot honour is refused with its reason (or,
with ``lenient``, reported on stderr and skipped). Nothing is silently ignored.

``policy_kwargs`` (and ``normalize`` written as a string) are read by :func:`parse_literal`,
a restricted parser over Python's ``ast``: literals, ``dict(...)`` / ``{...}``, lists and a
whitelist of names (``nn.ReLU``, ``th.nn.Tanh``, ...). Nothing is ever ``eval``-ed.

The entry replaces corral's own preset for (algo, env), and the fields an entry leaves
unset take Stable-Baselines3's defaults where corral's differ (``SB3_DEFAULTS``), so a run
is the one rl-zoo would launch. docs/config.md ("rl-zoo's hyperparameter files") has the
table for users.

The parts: :mod:`corral.zoo.literal` (the restricted parser and schedules),
:mod:`corral.zoo.context` (``Refused``, ``Context``), :mod:`corral.zoo.policy_keys` (policy,
normalize, policy_kwargs) and :mod:`corral.zoo.keys` (every other key, ``KEYS``,
``SB3_DEFAULTS``); this module reads a file's entry, translates and applies it, and lists
rl_zoo3's bundled entries. Every name is importable from here.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.errors import UserError
from corral.zoo.context import Context, Pairs, Refused  # noqa: F401 - re-exported
from corral.zoo.keys import KEYS, SB3_DEFAULTS
from corral.zoo.literal import ALLOWED_NAMES, Name, parse_literal, parse_schedule  # noqa: F401 - re-exported

ZOO_SPECIAL = ("default", "atari")


# ---------------------------------------------------------------------------
# The layout: one top-level key per env id, each a mapping of SB3 hyperparameters.


def is_zoo_layout(data: Any) -> bool:
    """True for rl-zoo's layout: every top-level value a mapping, and at least one of them an
    rl-zoo entry (it has ``n_timesteps`` or ``policy``, which every rl-zoo entry has and no
    corral section does)."""
    if not isinstance(data, dict) or not data:
        return False
    if not all(isinstance(v, dict) for v in data.values()):
        return False
    return any("n_timesteps" in v or "policy" in v for v in data.values())


def select_entry(data: dict, env_id: str, is_atari: bool, source: str = "the file") -> tuple[str, dict]:
    """The entry for ``env_id`` (its own key, else ``atari`` for an ALE game, else ``default``),
    as rl-zoo's ``ExperimentManager.read_hyperparameters`` picks it. Returns ``(key, entry)``."""
    for key in (env_id, env_id.removeprefix("native:")):
        if key in data:
            return key, dict(data[key])
    if is_atari and "atari" in data:
        return "atari", dict(data["atari"])
    if "default" in data:
        return "default", dict(data["default"])
    envs = ", ".join(k for k in data if k not in ZOO_SPECIAL)
    raise UserError(f"{source} has no entry for {env_id!r} and no 'default' entry; its envs: {envs}")


def bundled_file(algo: str) -> Path:
    """``rl_zoo3/hyperparams/<algo>.yml`` of the installed rl_zoo3 (found without importing it,
    which would import Stable-Baselines3)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--zoo reads rl-zoo's bundled hyperparameter files from the rl_zoo3 package, which is not "
                        "installed: pip install 'corral[zoo]' (or give a file: --config path/to/hyperparams/ALGO.yml)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "hyperparams"
    path = folder / f"{algo}.yml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in folder.glob("*.yml")))
        raise UserError(f"rl-zoo has no hyperparameter file for {algo!r} ({folder}); it has: {have}")
    return path


def bundled_files() -> list[Path]:
    """Every ``rl_zoo3/hyperparams/*.yml`` (``corral list --zoo``, benchmarks/zoo_entries.py)."""
    return sorted(bundled_file("ppo").parent.glob("*.yml"))


# ---------------------------------------------------------------------------
# Translation of one entry.


@dataclass
class Translation:
    """An entry in corral's terms: ``pairs`` (dotted corral keys and values, in order),
    ``refused`` (rl-zoo key -> reason), where it came from."""

    algo: str
    env_id: str
    entry_key: str
    source: str
    pairs: list[tuple[str, Any]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rl-zoo entry {self.entry_key!r} of {self.source}"


def translate(algo: str, data: dict, env_id: str, *, is_atari: bool, source: str = "the file",
              algo_cfg: Any = None) -> Translation:
    """Map the entry of ``data`` (an rl-zoo file) for ``env_id`` to corral's keys."""
    if algo_cfg is None:
        from corral.algos import get_algo

        algo_cfg = get_algo(algo).cls.Config()
    key, entry = select_entry(data, env_id, is_atari, source)
    ctx = Context(algo=algo, algo_cfg=algo_cfg, env_id=env_id, is_atari=is_atari, entry=entry)
    out = Translation(algo=algo, env_id=env_id, entry_key=key, source=source)
    for name, value in SB3_DEFAULTS.get(algo, {}).items():
        out.pairs.append((f"{algo}.{name}", value))
    for k, v in entry.items():
        fn = KEYS.get(k)
        if fn is None:
            out.refused[k] = "not a key corral knows from rl-zoo or Stable-Baselines3"
            continue
        try:
            out.pairs += fn(v, ctx)
        except Refused as e:
            out.refused[k] = str(e)
        except UserError as e:  # a bad value (a schedule, a policy_kwargs expression)
            out.refused[k] = str(e)
        out.refused.update(ctx.refused)
        ctx.refused.clear()
    return out


def refusal_message(t: Translation) -> str:
    """One message naming every refused key, its reason and the fix."""
    parts = "; ".join(f"{k!r}: {why}" for k, why in t.refused.items())
    n = len(t.refused)
    return (f"{t.label} for {t.algo}: corral cannot honour {'this key' if n == 1 else f'these {n} keys'}: {parts}. "
            "Fix: remove or change the key in the file, or pass --lenient to run without "
            f"{'it' if n == 1 else 'them'} (each is reported)")


def apply(cfg: Any, t: Translation, *, lenient: bool = False) -> None:
    """Apply a translation onto a TrainConfig (checking every value as ``--set`` does). Refused
    keys raise one ``UserError``, or with ``lenient`` are reported on stderr, one line each."""
    from corral import config as C

    if t.refused:
        if not lenient:
            raise UserError(refusal_message(t))
        for k, why in t.refused.items():
            print(f"corral: warning: {t.label}: skipped {k!r} (--lenient): {why}", file=sys.stderr)
    for key, value in t.pairs:
        try:
            C.apply_set(cfg, [(key, value)])
        except UserError as e:
            raise UserError(f"{t.label}: {e}") from None


def load_entry(algo: str, env_id: str, *, path: str | None = None, data: dict | None = None,
               is_atari: bool = False, algo_cfg: Any = None) -> Translation:
    """Read an rl-zoo file (``path``, else rl_zoo3's bundled ``<algo>.yml``) and translate its entry."""
    from corral import config as C

    if data is None:
        path = str(path or bundled_file(algo))
        data = C.load_yaml(path)
        if not is_zoo_layout(data):
            raise UserError(f"{path!r} is not in rl-zoo's layout (one entry per env id with n_timesteps / policy)")
    return translate(algo, data, env_id, is_atari=is_atari, source=path or "the file", algo_cfg=algo_cfg)


def missing_algo_reason(algo: str) -> str:
    """Why a bundled file's algorithm is not one corral runs."""
    if algo == "her":
        return ("her.yml is rl-zoo 1.x's layout (model_class names the algorithm); corral's HER is the replay of "
                "sac / td3 / ddpg / dqn (replay: her), given in the algorithm's own file as replay_buffer_class: "
                "HerReplayBuffer, as SB3 >= 1.1 writes it")
    return f"corral has no {algo!r}"


def list_entries() -> list[dict]:
    """Every entry of rl_zoo3's bundled files: algo, env, and "ok" or the refusal reasons
    (``corral list --zoo``). Env ids that are not registered here are reported as such."""
    import gymnasium as gym

    from corral import config as C
    from corral.algos import ALGOS

    rows = []
    for path in bundled_files():
        algo = path.stem
        data = C.load_yaml(str(path))
        for env_id in data:
            row = {"algo": algo, "env": env_id, "status": "ok", "reasons": {}}
            if algo not in ALGOS:
                row["status"] = "refused"
                row["reasons"] = {"algo": missing_algo_reason(algo)}
                rows.append(row)
                continue
            if env_id not in ZOO_SPECIAL:
                try:
                    gym.spec(env_id)
                except Exception:
                    row["status"] = "not installed"
            t = translate(algo, data, env_id, is_atari=env_id == "atari", source=str(path))
            if t.refused:
                row["status"] = "refused" if row["status"] == "ok" else row["status"]
                row["reasons"] = dict(t.refused)
            rows.append(row)
    return rows


def describe_keys() -> list[tuple[str, str]]:
    """The table's rows: rl-zoo key, what corral does with it (tests check docs/config.md has each key)."""
    return [(k, (fn.__doc__ or "").strip().split("\n")[0]) for k, fn in KEYS.items()]
