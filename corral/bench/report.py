"""``corral report``: a suite's evaluations as CSV, markdown tables and figures.

Reads a suite's output folder (``corral bench --out``: one run directory per run) or a results
folder that a report wrote before (``evals.csv``, ``runs.csv``, ``suite.yaml``, ``meta.json``:
what the repository commits), so a published page is rebuilt from committed data alone.

A cell's score is the mean return of its final evaluation (the suite's protocol: episodes,
deterministic); across seeds, the IQM with a 95% stratified-bootstrap interval
(``corral.bench.stats``), every seed beside it, and the peers' published figures for the same env
id at a budget at or below the cell's (``corral.bench.peers``).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from corral.bench import stats
from corral.bench.runner import read_json, read_rows
from corral.bench.suite import Suite, parse_suite
from corral.errors import UserError

EVAL_COLUMNS = ["suite", "env", "algo", "seed", "step", "wall_s", "cpu_s", "return", "return_std", "episodes"]
RUN_COLUMNS = ["suite", "env", "algo", "seed", "budget", "status", "env_steps", "final_return", "cpu_s", "wall_s",
               "code", "code_changed", "given"]


@dataclass
class Results:
    suite: Suite
    suite_text: str
    meta: dict
    runs: list[dict]
    evals: list[dict]

    def cells(self) -> list[tuple[str, str]]:
        """(algo, env) in the suite's order."""
        return [(algo, env) for algo, env, _, _ in self.suite.cells]


INTS = {"seed", "step", "budget", "env_steps", "episodes"}
FLOATS = {"wall_s", "cpu_s", "return", "return_std", "final_return"}


def _typed(row: dict) -> dict:
    """A CSV row with its numbers and flags as written."""
    out = {}
    for k, v in row.items():
        if k in INTS | FLOATS:
            out[k] = None if v == "" else int(v) if k in INTS else float(v)
        elif k == "code_changed":
            out[k] = v == "True"
        else:
            out[k] = v or None
    return out


def collect(path: Path) -> Results:
    """The results of a suite output folder or of a results folder."""
    path = Path(path)
    suite_file = path / "suite.yaml"
    if not suite_file.is_file():
        raise UserError(f"{str(path)!r} holds no suite.yaml: give a folder made by `corral bench --out` or by "
                        "`corral report --out`")
    text = suite_file.read_text()
    if (path / "runs.csv").is_file() and (path / "evals.csv").is_file() and not (path / "runs").is_dir():
        meta = read_json(path / "meta.json", {})
        suite = parse_suite(yaml.safe_load(text), source=str(suite_file), budgets=meta.get("budgets"))
        with open(path / "runs.csv", newline="") as f:
            runs = [_typed(r) for r in csv.DictReader(f)]
        with open(path / "evals.csv", newline="") as f:
            evals = [_typed(r) for r in csv.DictReader(f)]
        return Results(suite, text, meta, runs, evals)
    if not (path / "runs").is_dir():
        raise UserError(f"{str(path)!r} has neither runs/ (a suite's output) nor runs.csv and evals.csv (results)")
    suite = parse_suite(yaml.safe_load(text), source=str(suite_file))
    meta = read_json(path / "bench.json", {})
    if suite.zoo:  # rl-zoo's budgets, kept so that the results read without rl_zoo3
        meta["budgets"] = {f"{a}/{e}": steps for a, e, steps, _ in suite.cells if f"{a}/{e}" in suite.zoo}
    runs, evals = [], []
    for d in sorted((path / "runs").iterdir()):
        spec = read_json(d / "spec.json")
        if spec is None:
            continue
        result = read_json(d / "result.json")
        bench = read_json(d / "bench.json", {})
        rows = {}
        for row in read_rows(d / "evals.jsonl"):  # a resumed run's rows past its checkpoint were dropped
            rows[row["step"]] = row
        ident = dict(suite=suite.name, env=spec["env"], algo=spec["algo"], seed=spec["seed"])
        for step in sorted(rows):
            r = rows[step]
            evals.append({**ident, "step": step, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "return": r["return"],
                          "return_std": r.get("return_std"), "episodes": r.get("episodes")})
        last = rows[max(rows)] if rows else {}
        status = ("done" if result else "refused" if bench.get("refused")
                  else "failed" if bench.get("failures") else "partial" if rows else "queued")
        runs.append({**ident, "budget": spec["steps"], "status": status,
                     "env_steps": result["env_steps"] if result else last.get("step", 0),
                     "final_return": result["eval_return"] if result else None,
                     "cpu_s": result["cpu_s"] if result else last.get("cpu_s"),
                     "wall_s": result["train_seconds"] if result else last.get("wall_s"),
                     "code": (result or bench).get("code", {}).get("id"),
                     "code_changed": bool(bench.get("code_changes")), "given": given_text(spec.get("given"))})
    return Results(suite, text, meta, _in_order(suite, runs), _in_order(suite, evals))


def given_text(given: dict | None) -> str | None:
    """A run's ``corral bench --set`` keys as command-line text (None without any)."""
    if not given:
        return None
    return " ".join(f"--set {k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
                    for k, v in sorted(given.items()))


def _in_order(suite: Suite, rows: list[dict]) -> list[dict]:
    """Rows in the suite's cell order, then by seed and step."""
    order = {cell: i for i, cell in enumerate(f"{a}/{e}" for a, e, _, _ in suite.cells)}
    return sorted(rows, key=lambda r: (order.get(f"{r['algo']}/{r['env']}", 1e9), r["seed"], r.get("step", 0)))


RANK = {"done": 3, "partial": 2, "failed": 1, "refused": 1, "queued": 0}


def merge(parts: list[Results]) -> Results:
    """One suite's results from several folders (runs made on other machines or in other
    sessions, a committed results folder and a new output folder): per (env, algo, seed) the
    furthest run (done, then partial, then failed or refused, then queued), the later folder on a
    tie; its evaluations come from the same folder. The suite and meta are the last folder's."""
    names = {r.suite.name for r in parts}
    if len(names) > 1:
        raise UserError(f"cannot merge the results of different suites ({', '.join(sorted(names))}): give one "
                        "suite's folders together, or --page to put several suites on one page")
    if len(parts) == 1:
        return parts[0]
    chosen: dict[tuple, tuple[int, dict]] = {}
    for i, part in enumerate(parts):
        for r in part.runs:
            run = (r["env"], r["algo"], r["seed"])
            if run not in chosen or RANK[r["status"]] >= RANK[chosen[run][1]["status"]]:
                chosen[run] = (i, r)
    last = parts[-1]
    cells = {(a, e) for a, e in last.cells()}
    runs = [r for _, r in chosen.values() if (r["algo"], r["env"]) in cells]
    evals = [e for i, part in enumerate(parts) for e in part.evals
             if chosen.get((e["env"], e["algo"], e["seed"]), (None,))[0] == i and (e["algo"], e["env"]) in cells]
    meta = {**{k: v for part in parts for k, v in part.meta.items()}, **last.meta}
    budgets = {k: v for part in parts for k, v in part.meta.get("budgets", {}).items()}
    if budgets:
        meta["budgets"] = budgets
    return Results(last.suite, last.suite_text, meta, _in_order(last.suite, runs), _in_order(last.suite, evals))


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})


def _fmt(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.1f}"


def _steps(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % (size // 10) == 0:
            return f"{n / size:g}{unit}"
    return f"{n:,}"


def cell_rows(res: Results, reps: int = 2000) -> list[dict]:
    """Per cell: the IQM of the finished seeds' final returns, its interval, every seed, the
    CPU-hours spent (all runs, finished or not) and the peers' figures."""
    from corral.bench.peers import load_peers

    peers = load_peers()
    sources = [s for s in res.suite.peers if s in peers.sources] or None
    by_cell = defaultdict(list)
    for r in res.runs:
        by_cell[(r["algo"], r["env"])].append(r)
    out = []
    for algo, env, steps, _ in res.suite.cells:
        runs = by_cell.get((algo, env), [])
        finished = [r for r in runs if r["status"] == "done"]
        values = np.array([r["final_return"] for r in finished], dtype=np.float64)
        point = lo = hi = None
        if values.size:
            point, lo, hi = stats.stratified_bootstrap_ci(values, stats.aggregate_iqm, reps=reps)
        budget = runs[0]["budget"] if runs else steps
        out.append({"algo": algo, "env": env, "budget": budget, "iqm": point, "lo": lo, "hi": hi,
                    "seeds": [(r["seed"], r["final_return"], r["code_changed"]) for r in finished],
                    "planned": len(runs), "cpu_h": sum((r["cpu_s"] or 0) for r in runs) / 3600,
                    "peers": peers.published(res.suite.peer_env(env), algo, budget, sources)})
    return out


def _given_line(runs: list[dict], same: bool) -> str:
    """Which runs had which ``corral bench --set`` keys."""
    if same:
        return (f"- **Keys given with `corral bench --set`** (every run, over the suite's): `{runs[0]['given']}` "
                "(in the command above).")
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[r.get("given") or "none"][f"{r['algo']}/{r['env']}"].append(r["seed"])
    parts = [f"`{g}`: " + "; ".join(f"{cell} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                                    for cell, seeds in cells.items()) for g, cells in groups.items()]
    return ("- **Keys given with `corral bench --set`** (over the suite's; the command above with each group's "
            "keys reruns it): " + " / ".join(parts) + ".")


def markdown(res: Results, reps: int = 2000, figures: dict | None = None, heading: str = "##") -> str:
    """The suite's section: protocol, machine, the command, the cell table, aggregates."""
    s = res.suite
    rows = cell_rows(res, reps)
    ev = s.eval
    machine = res.meta.get("machine", {})
    codes = sorted({r["code"] for r in res.runs if r.get("code")})
    done = sum(r["status"] == "done" for r in res.runs)
    lines = [f"{heading} {s.name}", ""]
    if s.description:
        lines += [s.description, ""]
    given = sorted({r.get("given") or "" for r in res.runs})
    lines += [
        f"- **Reproduce**: `corral bench {res.meta.get('suite_arg', s.name)}"
        f"{' ' + given[0] if len(given) == 1 and given[0] else ''} --out bench/{s.name} && "
        f"corral report bench/{s.name}` "
        f"({len(s.seeds)} seeds: {', '.join(map(str, s.seeds))}; {done} of {len(res.runs)} runs finished).",
        f"- **Protocol**: each run trains for the cell's budget from the (algo, env) preset"
        f"{' or rl-zoo' + chr(39) + 's entry' if s.zoo else ''}; its score is the mean "
        f"return of the final policy over {ev.get('episodes', 10)} evaluation episodes "
        f"({'the policy' + chr(39) + 's mode' if ev.get('deterministic', True) else 'sampled actions'}, the env's "
        f"own time limit), on envs apart from training; {ev.get('points', 10)} evaluations along the way give the "
        f"curves. Across seeds: the IQM (interquartile mean) with a 95% stratified-bootstrap interval "
        f"({reps} resamples), every seed beside it.",
    ]
    if machine:
        lines.append(f"- **Machine**: {machine.get('cpu')}, {machine.get('cores')} cores, one thread a run; "
                     f"torch {machine.get('torch')}, Python {machine.get('python')}. CPU-h: the CPU time of the "
                     "cell's runs, evaluations included.")
    if codes:
        lines.append(f"- **Code**: corral {', '.join(codes)}.")
    if any(given):
        lines.append(_given_line(res.runs, len(given) == 1))
    if s.zoo:
        lenient = [c for c, m in s.zoo.items() if m == "lenient"]
        lines.append(f"- **Hyperparameters**: {', '.join(s.zoo)} run rl-zoo's own entry as `corral train ALGO ENV "
                     "--zoo` does (rl_zoo3's bundled files, its n_timesteps as the budget)"
                     + (f"; {', '.join(lenient)} with --lenient: the keys corral cannot honour are skipped "
                        "(`corral train ALGO ENV --zoo` names them)" if lenient else "") + ".")
    same = ("same env id" if all(s.peer_env(e) == e for e in s.envs)
            else "same env id unless another is named")
    lines += ["", f"| env | algo | budget | IQM [95% CI] | seeds | CPU-h | published ({same}, budget at or below) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    marked = False
    for c in rows:
        iqm = (f"**{_fmt(c['iqm'])}** [{_fmt(c['lo'])}, {_fmt(c['hi'])}]" if c["iqm"] is not None
               else "not finished")
        seeds = " / ".join(_fmt(v) + ("†" if changed else "") for _, v, changed in c["seeds"])
        marked |= any(ch for _, _, ch in c["seeds"])
        if len(c["seeds"]) < c["planned"]:
            seeds += f" ({len(c['seeds'])} of {c['planned']})"
        on = "" if s.peer_env(c["env"]) == c["env"] else f" on {s.peer_env(c['env'])}"
        peers = "; ".join(p.describe() + on for p in c["peers"]) or "-"
        fps = s.frames_per_step(c["env"])
        budget = _steps(c["budget"]) + (f" ({_steps(c['budget'] * fps)} frames)" if fps > 1 else "")
        lines.append(f"| {c['env']} | {c['algo']} | {budget} | {iqm} | {seeds or '-'} | "
                     f"{c['cpu_h']:.3f} | {peers} |")
    total = sum(c["cpu_h"] for c in rows)
    lines += ["", f"{total:.1f} CPU-hours in all."]
    if marked:
        lines.append("† resumed on other code than it started on (`--allow-code-change`).")
    agg = aggregates(res, reps)
    if agg:
        lines += ["", "Aggregates over each algorithm's envs, scores normalized as (return - random) / "
                      "(reference - random) with the suite's per-env figures (IQM, median, mean, optimality gap "
                      "with 95% stratified-bootstrap intervals, rliable's definitions):", "",
                  "| algo | envs | IQM | median | mean | optimality gap |", "| --- | --- | --- | --- | --- | --- |"]
        for algo, (envs, est) in agg.items():
            cells = [f"{est[m][0]:.2f} [{est[m][1]:.2f}, {est[m][2]:.2f}]" for m in
                     ("iqm", "median", "mean", "optimality_gap")]
            lines.append(f"| {algo} | {len(envs)} | " + " | ".join(cells) + " |")
    if figures:
        lines.append("")
        for title, rel in figures.items():
            lines.append(f"![{title}]({rel})")
    return "\n".join(lines) + "\n"


def score_matrices(res: Results) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per algo: its normalized envs and a [seeds, envs] matrix of final returns, over the seeds
    finished on every one of those envs."""
    finals = defaultdict(dict)
    for r in res.runs:
        if r["status"] == "done" and res.suite.normalization(r["env"]) is not None:
            finals[r["algo"]].setdefault(r["env"], {})[r["seed"]] = r["final_return"]
    out = {}
    for algo, envs in finals.items():
        names = sorted(envs)
        seeds = sorted(set.intersection(*(set(envs[e]) for e in names)))
        if not seeds:
            continue
        low = np.array([res.suite.normalization(e)[0] for e in names])
        high = np.array([res.suite.normalization(e)[1] for e in names])
        raw = np.array([[envs[e][s] for e in names] for s in seeds], dtype=np.float64)
        out[algo] = (names, stats.normalize(raw, low, high))
    return out


def aggregates(res: Results, reps: int = 2000) -> dict:
    """{algo: (envs, {metric: (point, lo, hi)})} for the algorithms run on two envs or more."""
    mats = {a: m for a, m in score_matrices(res).items() if len(m[0]) >= 2}
    est = stats.interval_estimates({a: m[1] for a, m in mats.items()}, reps=reps)
    return {a: (mats[a][0], est[a]) for a in mats}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_curves(res: Results, env: str, path: Path, reps: int = 500) -> Path:
    """IQM of the evaluations across seeds with its 95% band, against env steps (emulator frames on
    Atari) and CPU-hours."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    ax_steps, ax_cpu = fig.subplots(1, 2)
    fps = res.suite.frames_per_step(env)
    for algo in [a for a, e, _, _ in res.suite.cells if e == env]:
        by_step = defaultdict(list)
        for r in res.evals:
            if r["algo"] == algo and r["env"] == env:
                by_step[r["step"]].append((r["return"], r["cpu_s"]))
        if not by_step:
            continue
        steps = sorted(by_step)
        pts = [stats.stratified_bootstrap_ci(np.array([v for v, _ in by_step[s]]), stats.aggregate_iqm, reps=reps)
               for s in steps]
        mid, lo, hi = (np.array(x) for x in zip(*pts))
        cpu_h = np.array([np.mean([c for _, c in by_step[s]]) / 3600 for s in steps])
        for ax, x in ((ax_steps, [s * fps for s in steps]), (ax_cpu, cpu_h)):
            (line,) = ax.plot(x, mid, label=algo)
            ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    from matplotlib.ticker import FuncFormatter

    ax_steps.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _steps(int(x)) if x > 0 else "0"))
    ax_steps.set_xlabel(f"frames ({fps} per agent step)" if fps > 1 else "env steps")
    ax_cpu.set_xlabel("CPU-hours (mean over seeds)")
    for ax in (ax_steps, ax_cpu):
        ax.set_ylabel("evaluation return (IQM over seeds)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"{res.suite.name}: {env}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def figure_files(res: Results) -> dict[str, str]:
    """Title -> file name of each figure a report of ``res`` has: curves per env with
    evaluations; aggregate intervals and performance profiles where algorithms span envs."""
    name = res.suite.name
    figs = {f"{name} {env}": f"{name}-{_safe(env)}.png" for env in dict.fromkeys(e for _, e, _, _ in res.suite.cells)
            if any(r["env"] == env for r in res.evals)}
    if any(len(m[0]) >= 2 for m in score_matrices(res).values()):
        figs[f"{name} aggregates"] = f"{name}-aggregates.png"
        figs[f"{name} performance profiles"] = f"{name}-profiles.png"
    return figs


def write_figures(res: Results, folder: Path, reps: int = 500) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = figure_files(res)
    envs = {f"{res.suite.name} {e}": e for _, e, _, _ in res.suite.cells}
    agg = aggregates(res, reps)
    for title, fname in files.items():
        path = folder / fname
        if title in envs:
            plot_curves(res, envs[title], path, reps)
        elif title.endswith("aggregates"):
            stats.plot_aggregates({a: est for a, (_, est) in agg.items()}, path)
        else:
            mats = {a: m[1] for a, m in score_matrices(res).items() if a in agg}
            taus = np.linspace(0.0, 1.2, 61)
            stats.plot_profiles(stats.performance_profile(mats, taus, reps=reps), taus, path)
    return {t: folder / f for t, f in files.items()}


def write_report(path: Path | list[Path], out: Path | None = None, reps: int = 2000,
                 figures: bool = True) -> list[Path]:
    """evals.csv, runs.csv, suite.yaml, meta.json, report.md and the figures into ``out``
    (default ``<path>/report``); ``out`` is then a results folder ``corral report`` reads again.
    Several folders of one suite are merged first (``merge``); ``out`` may be one of them."""
    paths = [Path(p) for p in (path if isinstance(path, list) else [path])]
    res = merge([collect(p) for p in paths])  # all read before anything is written
    out = Path(out) if out else paths[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "evals.csv", res.evals, EVAL_COLUMNS)
    _write_csv(out / "runs.csv", res.runs, RUN_COLUMNS)
    if not (out / "runs").is_dir():  # not a suite's own output folder
        (out / "suite.yaml").write_text(res.suite_text)
        (out / "meta.json").write_text(json.dumps(res.meta, indent=1) + "\n")
    figs = write_figures(res, out, reps=min(reps, 500)) if figures else {}
    md = out / "report.md"
    md.write_text(markdown(res, reps, {t: p.name for t, p in figs.items()}, heading="#"))
    return [out / "evals.csv", out / "runs.csv", md, *figs.values()]


PAGE_HEAD = """# Results

Every figure on this page comes from `corral bench` and is published by `corral report` from the
evaluations committed under `benchmarks/results/` (one folder per suite: `evals.csv` has every
evaluation of every run, `runs.csv` one row per run, `suite.yaml` the suite as it ran). The page is
regenerated, not written by hand:

```bash
corral report benchmarks/results/* --page docs/results.md
```

A test checks that this page is what that command writes. How the figures are taken, how to run
a suite and how to read a report: [Benchmarking](benchmarking.md). The peers' columns quote only
figures for the same env id at a budget at or below the cell's, each with its seed count and
whether it is an evaluation or a training return (`corral/bench/peers.yaml` says where each one
comes from).
"""


def by_suite(paths: list[Path]) -> list[Results]:
    """The folders' results, those of one suite merged, in the order each suite first appears."""
    groups: dict[str, list[Results]] = {}
    for p in paths:
        res = collect(p)
        groups.setdefault(res.suite.name, []).append(res)
    return [merge(parts) for parts in groups.values()]


def page_text(paths: list[Path], reps: int = 2000, figures: str = "img/results") -> str:
    """The documentation page for the results folders ``paths`` (in the order given), its
    figures linked under ``figures`` (relative to the page)."""
    parts = [PAGE_HEAD]
    for res in by_suite(paths):
        links = {t: f"{figures}/{f}" for t, f in figure_files(res).items()}
        parts.append(markdown(res, reps, links))
    return "\n".join(parts)


def write_page(paths: list[Path], page: Path, figures: Path | None = None, reps: int = 2000) -> Path:
    """Write the page and its figures (default ``<page folder>/img/results``)."""
    folder = figures or page.parent / "img" / "results"
    for res in by_suite(paths):
        write_figures(res, folder, reps=min(reps, 500))
    rel = os.path.relpath(folder, page.parent)
    page.write_text(page_text(paths, reps, rel))
    return page
