"""Benchmark suites: a grid of algorithms x envs x seeds with a budget and an evaluation protocol.

A suite file is YAML::

    name: classic
    seeds: 3                      # or a list: [0, 1, 2]
    eval: {episodes: 10, points: 10, deterministic: true}   # points: evaluations over the budget
    peers: [rl-zoo, cleanrl]      # published figures shown beside each cell (corral/bench/peers.yaml)
    envs:                         # per env: budget and the scores that normalize it (aggregates)
      CartPole-v1: {steps: 100000, random: 22.0, reference: 500.0}
    grid:                         # blocks; each is algos x envs
      - algos: [ppo, dqn]
        envs: [CartPole-v1]
        steps: 50000              # optional: the block's budget
        set: {eval.num_envs: 5}   # optional: config keys for every cell of the block
        zoo: true                 # optional: start from rl-zoo's entry (``corral train --zoo``), not
                                  # the preset; ``lenient`` skips the keys corral cannot honour
    cells:                        # optional: per-cell overrides, keyed ALGO/ENV
      dqn/CartPole-v1: {steps: 60000, set: {dqn.lr: 0.001}}

A cell's budget is the first of: its ``cells`` entry, its block's ``steps``, its env's ``steps``,
the (algo, env) preset's ``steps`` (or, with ``zoo``, the rl-zoo entry's ``n_timesteps``). Every
run starts from the (algo, env) preset, as ``corral train`` does, or from rl-zoo's entry.
``envs.ENV.peer_env`` names the env id whose published figures ``corral report`` shows beside
the cell, marked with that id (rl-zoo's table is on ``LunarLander-v2``); ``envs.ENV.frames_per_step``
the emulator frames an agent step takes (default 4 on Atari ids, else 1), which the report
prints beside budgets and uses as the curves' axis. Nothing here runs anything: :func:`load_suite` reads and checks, ``Suite.runs()``
lists the runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from corral.errors import UserError

SUITE_KEYS = {"name", "description", "seeds", "eval", "peers", "envs", "grid", "cells", "checkpoint_every",
              "threads", "speeds", "machine"}
EVAL_KEYS = {"episodes", "points", "every", "deterministic", "num_envs"}
BLOCK_KEYS = {"algos", "envs", "steps", "set", "zoo"}
ENV_KEYS = {"steps", "random", "reference", "set", "peer_env", "frames_per_step"}
ZOO_MODES = {True: "strict", "strict": "strict", "lenient": "lenient"}
CELL_KEYS = {"steps", "set"}


@dataclass(frozen=True)
class Run:
    """One run of a suite: an ordinary run directory under ``<out>/runs/<name>``."""

    algo: str
    env: str
    seed: int
    steps: int
    sets: tuple[tuple[str, Any], ...]  # config keys: the suite's protocol, the cell's keys and ``given``
    zoo: str | None = None  # "strict" / "lenient": built from rl-zoo's entry (corral train --zoo)
    given: tuple[tuple[str, Any], ...] = ()  # the keys of ``corral bench --set`` (in ``sets`` too)

    @property
    def cell(self) -> str:
        return f"{self.algo}/{self.env}"

    @property
    def name(self) -> str:
        return f"{self.algo}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.env)}-s{self.seed}"

    def spec(self) -> dict:
        """What the run is: compared with the spec a run directory already holds."""
        spec = {"algo": self.algo, "env": self.env, "seed": self.seed, "steps": self.steps,
                "set": {k: v for k, v in self.sets}}
        if self.zoo:
            spec["zoo"] = self.zoo
        if self.given:
            spec["given"] = {k: v for k, v in self.given}
        return spec


@dataclass
class Suite:
    name: str
    description: str
    seeds: list[int]
    eval: dict
    peers: list[str]
    envs: dict[str, dict]
    cells: list[tuple[str, str, int, dict]]  # (algo, env, steps, sets) in the file's order
    zoo: dict[str, str] = field(default_factory=dict)  # "algo/env" -> "strict" / "lenient" (rl-zoo's entry)
    checkpoint_every: int | None = None
    threads: int = 1
    speeds: dict = field(default_factory=dict)  # "algo/env": {"steps_per_s", "rss_mb"} measured on `machine`
    machine: str | None = None
    source: str | None = None
    raw: dict = field(default_factory=dict)  # the mapping it was read from (copied into the output folder)

    def protocol_sets(self, steps: int) -> dict:
        """The evaluation and checkpoint keys every run of the suite gets."""
        ev = self.eval
        every = ev.get("every") or max(1, steps // int(ev.get("points", 10)))
        sets = {"eval.episodes": int(ev.get("episodes", 10)), "eval.every": int(every),
                "eval.deterministic": bool(ev.get("deterministic", True)),
                "checkpoint.every": int(self.checkpoint_every or every), "checkpoint.keep": 1,
                "threads": self.threads, "progress": False}
        if "num_envs" in ev:
            sets["eval.num_envs"] = int(ev["num_envs"])
        return sets

    def runs(self, seeds: list[int] | None = None, steps_scale: float = 1.0, only: list[str] | None = None,
             given: dict | None = None) -> list[Run]:
        """Every run, seed-major (all cells' first seed before any second seed: a suite cut short
        still has one seed of every cell). ``steps_scale`` shrinks every budget (a smoke run);
        ``only`` keeps the cells whose ``algo/env`` contains one of the given strings; ``given``:
        config keys for every run, over the suite's (``corral bench --set``)."""
        out = []
        given = dict(given or {})
        for seed in seeds if seeds is not None else self.seeds:
            for algo, env, steps, sets in self.cells:
                if only and not any(s in f"{algo}/{env}" for s in only):
                    continue
                n = max(1, int(steps * steps_scale))
                merged = {**self.protocol_sets(n), **sets, **given}
                out.append(Run(algo, env, seed, n, tuple(sorted(merged.items())), self.zoo.get(f"{algo}/{env}"),
                               tuple(sorted(given.items()))))
        return out

    def normalization(self, env: str) -> tuple[float, float] | None:
        e = self.envs.get(env, {})
        if "random" in e and "reference" in e:
            return float(e["random"]), float(e["reference"])
        return None

    def peer_env(self, env: str) -> str:
        """The env id whose published figures stand beside ``env``'s cells."""
        return str(self.envs.get(env, {}).get("peer_env", env))

    def frames_per_step(self, env: str) -> int:
        """Emulator frames per agent step, for the frame counts a report prints beside steps:
        ``envs.ENV.frames_per_step``, else 4 on an Atari id (corral's Atari preprocessing and
        EnvPool's skip 4 frames a step), else 1."""
        given = self.envs.get(env, {}).get("frames_per_step")
        if given is not None:
            return int(given)
        return 4 if env.startswith("ALE/") or "NoFrameskip" in env else 1


def builtin_suites() -> dict[str, Path]:
    """Name -> file of the suites shipped with corral."""
    folder = resources.files("corral.bench") / "suites"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def load_suite(name_or_path: str | Path) -> Suite:
    """A built-in suite by name, or a suite file."""
    path = Path(name_or_path)
    builtin = builtin_suites()
    if not path.is_file():
        if str(name_or_path) not in builtin:
            raise UserError(f"no suite {str(name_or_path)!r}: give a suite file or one of {', '.join(sorted(builtin))} "
                            "(`corral bench --list`)")
        path = builtin[str(name_or_path)]
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"suite {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_suite(data, source=str(path))


def _check_keys(what: str, given: dict, allowed: set) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise UserError(f"{what}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def parse_suite(data: Any, source: str = "<suite>", budgets: dict[str, int] | None = None) -> Suite:
    """Check a suite's mapping and resolve every cell's budget and overrides. ``budgets`` ("algo/env" ->
    steps) are the budgets a report recorded: a zoo cell found there is not looked up in rl_zoo3 again,
    so results are read on a machine without it."""
    from corral.algos import ALGOS
    from corral.train.setup import load_preset

    if not isinstance(data, dict):
        raise UserError(f"suite {source!r}: expected a mapping with 'grid' (and 'envs', 'seeds', 'eval')")
    _check_keys(f"suite {source!r}", data, SUITE_KEYS)
    name = str(data.get("name") or Path(source).stem)
    seeds = data.get("seeds", 3)
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise UserError(f"suite {source!r}: 'seeds' is empty")
    ev = dict(data.get("eval") or {})
    _check_keys(f"suite {source!r}: eval", ev, EVAL_KEYS)
    envs = {str(k): dict(v or {}) for k, v in (data.get("envs") or {}).items()}
    for env, e in envs.items():
        _check_keys(f"suite {source!r}: envs.{env}", e, ENV_KEYS)
    overrides = {str(k): dict(v or {}) for k, v in (data.get("cells") or {}).items()}
    cells: list[tuple[str, str, int, dict]] = []
    zoo: dict[str, str] = {}
    seen = set()
    for i, block in enumerate(data.get("grid") or []):
        where = f"suite {source!r}: grid[{i}]"
        if not isinstance(block, dict):
            raise UserError(f"{where}: expected a mapping with 'algos' and 'envs'")
        _check_keys(where, block, BLOCK_KEYS)
        zoo_mode = _zoo_mode(where, block.get("zoo", False))
        for algo in block.get("algos") or []:
            if algo not in ALGOS:
                raise UserError(f"{where}: unknown algorithm {algo!r} (`corral list` shows them)")
            for env in block.get("envs") or []:
                key = f"{algo}/{env}"
                if key in seen:
                    raise UserError(f"{where}: cell {key} is listed twice")
                seen.add(key)
                cell = overrides.get(key, {})
                _check_keys(f"suite {source!r}: cells.{key}", cell, CELL_KEYS)
                steps = (cell.get("steps") or block.get("steps") or envs.get(env, {}).get("steps")
                         or (((budgets or {}).get(key) or _zoo_steps(algo, env, zoo_mode)) if zoo_mode else
                             load_preset(algo, env, base=ALGOS[algo].cls.name).get("steps")))
                if not steps:
                    raise UserError(f"{where}: cell {key} has no budget: give 'steps' in the block, in "
                                    f"envs.{env} or in cells.{key} (there is no preset for it)")
                sets = {**envs.get(env, {}).get("set", {}), **(block.get("set") or {}), **cell.get("set", {})}
                cells.append((algo, str(env), int(float(steps)), sets))
                if zoo_mode:
                    zoo[key] = zoo_mode
    if not cells:
        raise UserError(f"suite {source!r}: the grid names no cells (give 'grid' blocks with 'algos' and 'envs')")
    stray = sorted(set(overrides) - seen)
    if stray:
        raise UserError(f"suite {source!r}: cells.{stray[0]} is not in the grid")
    return Suite(name=name, description=str(data.get("description", "")).strip(), seeds=seeds, eval=ev,
                 peers=list(data.get("peers") or []), envs=envs, cells=cells, zoo=zoo,
                 checkpoint_every=data.get("checkpoint_every"), threads=int(data.get("threads", 1)),
                 speeds=dict(data.get("speeds") or {}), machine=data.get("machine"), source=source, raw=data)


def _zoo_mode(where: str, value: Any) -> str | None:
    if value is False or value is None:
        return None
    if value not in ZOO_MODES:
        raise UserError(f"{where}: zoo: expected true, false or lenient, got {value!r}")
    return ZOO_MODES[value]


def _zoo_steps(algo: str, env: str, mode: str) -> int | None:
    """The budget of rl-zoo's entry for the cell (its ``n_timesteps``); a strict cell whose entry
    has keys corral cannot honour is refused here, before any run starts."""
    from corral import zoo as Z
    from corral.train.setup import _is_atari

    t = Z.load_entry(algo, env, is_atari=_is_atari(env))
    if t.refused and mode == "strict":
        raise UserError(Z.refusal_message(t).replace("pass --lenient", "give the block 'zoo: lenient'"))
    return next((int(v) for k, v in reversed(t.pairs) if k == "steps"), None)
