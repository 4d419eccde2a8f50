"""``corral bench`` / ``corral report``: suites, runs that survive a killed driver and resume
exactly, retries, refusal on changed code, Ray placement, the report's numbers."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from checkpoint_state import assert_same_checkpoint

from corral.bench import execute, report, runner
from corral.bench.suite import load_suite, parse_suite
from corral.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())"]

# Two cells x two seeds, each run a few seconds with a checkpoint every 2,048 steps (PPO) /
# 1,000 steps (DQN): long enough to be killed between checkpoints, short enough for CI.
TINY = {
    "name": "tiny",
    "seeds": 2,
    "eval": {"episodes": 3, "points": 4},
    "checkpoint_every": 2048,
    "envs": {"CartPole-v1": {"random": 22.0, "reference": 500.0}},
    "grid": [
        {"algos": ["ppo"], "envs": ["CartPole-v1"], "steps": 32768,
         "set": {"tensorboard": False}},
        {"algos": ["dqn"], "envs": ["CartPole-v1"], "steps": 4000,
         "set": {"tensorboard": False, "dqn.learning_starts": 500, "checkpoint.every": 1000}},
    ],
}


def write_suite(folder: Path, data: dict = TINY) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def bench(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "bench", *map(str, args), "--no-live"], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def assert_same_runs(a: Path, b: Path) -> None:
    names = sorted(p.name for p in (a / "runs").iterdir())
    assert names == sorted(p.name for p in (b / "runs").iterdir())
    for name in names:
        assert_same_checkpoint(a / "runs" / name / "checkpoints" / "latest.pt",
                               b / "runs" / name / "checkpoints" / "latest.pt", name)
        ea = [(r["step"], r["return"]) for r in runner.read_rows(a / "runs" / name / "evals.jsonl")]
        eb = [(r["step"], r["return"]) for r in runner.read_rows(b / "runs" / name / "evals.jsonl")]
        assert ea == eb, name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The tiny suite run once, start to end."""
    folder = tmp_path_factory.mktemp("bench")
    suite = write_suite(folder)
    out = folder / "out"
    r = bench(suite, "--out", out, "--jobs", 2)
    assert r.returncode == 0, r.stdout + r.stderr
    return suite, out


# --- suites


def test_a_cell_budget_comes_from_the_cell_then_the_block_then_the_env_then_the_preset():
    data = {"envs": {"CartPole-v1": {"steps": 7000}, "Pendulum-v1": {}},
            "grid": [{"algos": ["ppo", "dqn"], "envs": ["CartPole-v1"], "steps": 9000},
                     {"algos": ["a2c"], "envs": ["CartPole-v1"]},
                     {"algos": ["sac"], "envs": ["Pendulum-v1"]}],
            "cells": {"dqn/CartPole-v1": {"steps": 5000, "set": {"dqn.lr": 0.002}}}}
    s = parse_suite(data)
    budgets = {f"{a}/{e}": n for a, e, n, _ in s.cells}
    assert budgets == {"ppo/CartPole-v1": 9000, "dqn/CartPole-v1": 5000, "a2c/CartPole-v1": 7000,
                       "sac/Pendulum-v1": 20000}  # sac: its Pendulum preset's budget
    runs = s.runs()
    assert [r.seed for r in runs] == [0] * 4 + [1] * 4 + [2] * 4  # one seed of every cell first
    dqn = next(r for r in runs if r.algo == "dqn")
    sets = dict(dqn.sets)
    assert sets["dqn.lr"] == 0.002 and sets["eval.every"] == 500 and sets["checkpoint.every"] == 500


@pytest.mark.parametrize("data, words", [
    ({"grid": [{"algos": ["ppo"], "envs": ["CartPole-v1"]}], "sedes": 3}, "unknown key 'sedes'"),
    ({"grid": [{"algos": ["nope"], "envs": ["CartPole-v1"]}]}, "unknown algorithm 'nope'"),
    ({"grid": [{"algos": ["ppo"], "envs": ["CartPole-v1"]}], "cells": {"dqn/CartPole-v1": {"steps": 1}}},
     "cells.dqn/CartPole-v1 is not in the grid"),
    ({"grid": [{"algos": ["ppo"], "envs": ["my.module:Env"]}]}, "has no budget"),
    ({"grid": []}, "names no cells"),
])
def test_a_bad_suite_is_refused_with_the_key_named(data, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        parse_suite(data)


def test_the_built_in_suites_load_and_list():
    from corral.bench.suite import builtin_suites

    names = set(builtin_suites())
    assert {"classic", "box2d", "mujoco", "pybullet", "atari", "hardcore"} <= names
    assert "zoo" in names
    for name in names:
        if name == "zoo" and importlib.util.find_spec("rl_zoo3") is None:
            with pytest.raises(UserError, match=r"corral\[zoo\]"):  # its budgets are rl-zoo's n_timesteps
                load_suite(name)
            continue
        s = load_suite(name)
        assert s.cells and s.seeds
    r = subprocess.run([*CLI, "bench", "--list"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "classic" in r.stdout and "mujoco" in r.stdout
    r = subprocess.run([*CLI, "bench", "nosuch"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no suite 'nosuch'" in r.stderr


# --- execution


def test_a_killed_suite_finishes_when_rerun_and_equals_one_never_interrupted(uninterrupted, tmp_path):
    """SIGKILL the driver and a run that has a checkpoint but is not finished; the same command
    again finishes the suite, and every run's final state (parameters, optimizer, random
    streams) and every evaluation equal those of the uninterrupted suite."""
    suite, ref = uninterrupted
    out = tmp_path / "out"
    driver = subprocess.Popen([*CLI, "bench", str(suite), "--out", str(out), "--jobs", "2", "--no-live"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    victim = out / "runs" / "ppo-CartPole-v1-s0"
    deadline = time.time() + 120
    status = {}
    while time.time() < deadline:  # the first checkpoint written, the run still going
        status = runner.read_json(victim / "status.json", {})
        if (victim / "checkpoints" / "latest.pt").is_file() and status.get("pid") and status["steps"] < 24000:
            break
        time.sleep(0.02)
    else:
        driver.kill()
        pytest.fail(f"no checkpoint within 2 minutes: {status}")
    os.kill(status["pid"], signal.SIGKILL)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(0.5)
    assert not (victim / "result.json").exists()
    r = bench(suite, "--out", out, "--jobs", 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert runner.read_json(victim / "bench.json")["attempts"] == 2  # resumed, not started again
    assert_same_runs(out, ref)


def test_sigterm_stops_a_suite_with_every_running_run_checkpointed_and_a_rerun_equals_one_never_stopped(
        uninterrupted, tmp_path):
    """One SIGTERM to the driver: it starts no more runs, each running run pauses after its
    current update with a checkpoint where it stood (not the last periodic one), none is booked
    as failed, and the driver exits 143 naming them. The same command finishes the suite, equal
    to the uninterrupted one."""
    suite, ref = uninterrupted
    out = tmp_path / "out"
    driver = subprocess.Popen([*CLI, "bench", str(suite), "--out", str(out), "--jobs", "2", "--no-live"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    victim = out / "runs" / "ppo-CartPole-v1-s0"
    deadline = time.time() + 120
    status = {}
    while time.time() < deadline:  # the run going, past its first update
        status = runner.read_json(victim / "status.json", {})
        if status.get("pid") and 0 < status["steps"] < 16000:
            break
        time.sleep(0.02)
    else:
        driver.kill()
        pytest.fail(f"the run did not start within 2 minutes: {status}")
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 143, stdout + stderr
    assert "ppo-CartPole-v1-s0" in stdout.split("stopped with a checkpoint")[1]
    status = runner.read_json(victim / "status.json")
    assert status["state"] == "stopped" and not (victim / "result.json").exists()
    at = torch.load(victim / "checkpoints" / "latest.pt", weights_only=True)["counters"]["env_steps"]
    assert at == status["steps"] == runner.read_json(victim / "cpu.json")["step"]
    assert "failures" not in runner.read_json(victim / "bench.json")
    assert not (out / "runs" / "dqn-CartPole-v1-s1" / "bench.json").exists()  # queued, never started
    r = bench(suite, "--out", out, "--jobs", 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert runner.read_json(victim / "bench.json")["attempts"] == 2  # resumed, not started again
    assert_same_runs(out, ref)


def test_stop_after_pauses_the_running_runs_at_the_time_limit(uninterrupted, tmp_path):
    """``--stop-after 12``: a run far from its budget is paused with a checkpoint where it stood
    (well before its end), and the driver exits 1 (not every run done) saying why."""
    suite, _ = uninterrupted
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = bench(suite, "--out", out, "--only", "ppo", "--seeds", "0", "--steps-scale", 60, "--stop-after", "12")
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stopped at the time limit" in r.stdout and "ppo-CartPole-v1-s0" in r.stdout.split("checkpoint")[-1]
    d = out / "runs" / "ppo-CartPole-v1-s0"
    status = runner.read_json(d / "status.json")
    assert status["state"] == "stopped" and 0 < status["steps"] < status["total"] // 4
    at = torch.load(d / "checkpoints" / "latest.pt", weights_only=True)["counters"]["env_steps"]
    assert at == status["steps"] and took < 60
    assert "failures" not in runner.read_json(d / "bench.json")


@pytest.mark.parametrize("text,seconds", [("5400", 5400), ("90m", 5400), ("2h30m", 9000), ("1h5m30s", 3930),
                                          ("45s", 45), ("0.5h", 1800)])
def test_durations_read_as_seconds(text, seconds):
    from corral.bench.cli import parse_duration

    assert parse_duration(text) == seconds


def test_a_bad_duration_is_refused_naming_it(tmp_path):
    r = bench("classic", "--stop-after", "soon")
    assert r.returncode == 2 and "'soon' is not a duration" in r.stderr
    r = bench("classic", "--stop-after", "90m", "--ray", "auto", "--out", tmp_path / "out")
    assert r.returncode == 2 and "--stop-after stops local runs" in r.stderr
    assert not (tmp_path / "out").exists()  # refused before a run directory is made


def test_rerunning_a_finished_suite_runs_nothing(uninterrupted):
    suite, out = uninterrupted
    before = {p: p.stat().st_mtime for p in (out / "runs").glob("*/result.json")}
    r = bench(suite, "--out", out)
    assert r.returncode == 0 and "4 of 4 runs done" in r.stdout
    assert {p: p.stat().st_mtime for p in (out / "runs").glob("*/result.json")} == before


def test_a_failing_run_is_retried_then_reported_with_its_error(tmp_path):
    data = {**TINY, "seeds": 1, "grid": [
        {"algos": ["ppo"], "envs": ["CartPole-v1"], "steps": 2048, "set": {"tensorboard": False}},
        {"algos": ["dqn"], "envs": ["CartPole-v1"], "steps": 2000, "set": {"dqn.no_such_option": 1}}]}
    suite = write_suite(tmp_path, data)
    r = bench(suite, "--out", tmp_path / "out", "--retries", 1)
    assert r.returncode == 1
    assert "1 of 2 runs done" in r.stdout and "failed: dqn-CartPole-v1-s0" in r.stdout
    assert "no_such_option" in r.stdout  # the end of its log
    bench_json = runner.read_json(tmp_path / "out" / "runs" / "dqn-CartPole-v1-s0" / "bench.json")
    assert bench_json["failures"] == 2  # the first try and one retry
    r = bench(suite, "--out", tmp_path / "out", "--retries", 1)  # used up: not tried again
    assert r.returncode == 1 and runner.read_json(tmp_path / "out" / "runs" / "dqn-CartPole-v1-s0" /
                                                  "bench.json")["failures"] == 2


def test_a_changed_suite_is_refused_rather_than_mixed_into_its_runs(uninterrupted, tmp_path):
    _, out = uninterrupted
    changed = {**TINY, "grid": [{**TINY["grid"][0], "steps": 8192}, TINY["grid"][1]]}
    r = bench(write_suite(tmp_path, changed), "--out", out)
    assert r.returncode == 2 and "another spec (set, steps differ)" in r.stderr  # eval.every follows the budget


def test_resuming_on_other_code_is_refused_unless_asked_and_the_report_marks_it(tmp_path):
    data = {**TINY, "seeds": 1, "grid": [TINY["grid"][1]]}
    suite = write_suite(tmp_path, data)
    out = tmp_path / "out"
    s = parse_suite(data)
    runs = s.runs()
    execute.prepare(s, out, runs)
    d = execute.run_dir(out, runs[0])
    # a run interrupted after its checkpoint at 2,000 steps, written by "other code"
    spec = runner.read_json(d / "spec.json")
    runner.write_json(d / "spec.json", {**spec, "steps": 2000})
    assert runner.run(d) == 0
    (d / "result.json").unlink()
    runner.write_json(d / "spec.json", spec)
    b = runner.read_json(d / "bench.json")
    b["code"]["id"] = "0.0.1@000000000000"
    runner.write_json(d / "bench.json", b)
    r = bench(suite, "--out", out)
    assert r.returncode == 1 and "refused" in r.stdout and "--allow-code-change" in r.stdout
    b = runner.read_json(d / "bench.json")
    b.pop("refused")
    runner.write_json(d / "bench.json", b)
    r = bench(suite, "--out", out, "--allow-code-change")
    assert r.returncode == 0, r.stdout + r.stderr
    change = runner.read_json(d / "bench.json")["code_changes"][0]
    assert change["from"] == "0.0.1@000000000000" and change["at_step"] == 2000
    res = report.collect(out)
    assert res.runs[0]["code_changed"]
    assert "†" in report.markdown(res, reps=100)


def test_the_suite_on_a_two_node_ray_cluster_equals_the_local_run(uninterrupted, tmp_path):
    """Each run a Ray task placed by Ray on a simulated two-node cluster: the same final states
    and evaluations as the local pool's."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    suite, ref = uninterrupted
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    from ray._common.utils import reset_ray_address

    reset_ray_address()
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        out = tmp_path / "out"
        s = load_suite(suite)
        runs = s.runs()
        execute.prepare(s, out, runs)
        outcome = execute.run_ray(s, out, runs, address=cluster.address, live=False)
        assert sorted(outcome.done) == sorted(r.name for r in runs), outcome
        nodes = {runner.read_json(out / "runs" / r.name / "status.json")["node"] for r in runs}
        assert len(nodes) == 2  # Ray used both nodes
        assert_same_runs(out, ref)
    finally:
        ray.shutdown()
        cluster.shutdown()


# --- reports


def test_the_report_gives_each_cell_the_iqm_of_its_seeds_and_reads_its_own_csv_back(uninterrupted, tmp_path):
    _, out = uninterrupted
    written = report.write_report(out, tmp_path / "results", reps=200)
    names = {p.name for p in written}
    assert {"evals.csv", "runs.csv", "report.md", "tiny-CartPole-v1.png"} <= names
    res = report.collect(out)
    finals = {(r["algo"], r["seed"]): r["final_return"] for r in res.runs}
    for r in res.runs:
        final = runner.read_json(out / "runs" / f"{r['algo']}-CartPole-v1-s{r['seed']}" / "result.json")
        assert r["final_return"] == final["eval_return"] and r["cpu_s"] > 0
    rows = {c["algo"]: c for c in report.cell_rows(res, reps=200)}
    for algo in ("ppo", "dqn"):
        seeds = sorted(finals[(algo, s)] for s in (0, 1))
        assert rows[algo]["iqm"] == pytest.approx(np.mean(seeds))  # IQM of 2 values: their mean
        assert rows[algo]["lo"] <= rows[algo]["iqm"] <= rows[algo]["hi"]
        assert rows[algo]["lo"] == pytest.approx(seeds[0]) or rows[algo]["lo"] > seeds[0]
    # every evaluation of every run, in the CSV, with the step grid of the suite (4 per run)
    evals = [r for r in res.evals if r["algo"] == "ppo" and r["seed"] == 0]
    assert [r["step"] for r in evals] == [8192, 16384, 24576, 32768]
    back = report.collect(tmp_path / "results")  # the results folder is read as the suite's output
    assert report.markdown(back, reps=200) == report.markdown(res, reps=200)


def _drop_run(folder: Path, algo: str, seed: int, final: float | None = None) -> None:
    """Edit a results folder as if ``algo``'s run of ``seed`` had not started there (or, with
    ``final``, had finished with that return)."""
    import csv

    for name in ("runs.csv", "evals.csv"):
        with open(folder / name, newline="") as f:
            rows = list(csv.DictReader(f))
        mine = [r for r in rows if r["algo"] == algo and r["seed"] == str(seed)]
        if name == "evals.csv" and final is None:
            rows = [r for r in rows if r not in mine]
        for r in mine if name == "runs.csv" else []:
            r.update(final_return=str(final)) if final is not None else r.update(
                status="queued", env_steps="0", final_return="", cpu_s="", wall_s="")
        with open(folder / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def test_reports_of_one_suite_made_apart_merge_into_one(uninterrupted, tmp_path):
    """Runs of one suite finished on two machines (or in two sessions, the first folder lost but
    its results committed) publish as one report: each seed's furthest run, the later folder on a
    tie, with its own evaluations; folders of different suites are refused."""
    _, out = uninterrupted
    a, b = tmp_path / "a", tmp_path / "b"
    report.write_report(out, a, reps=50, figures=False)
    report.write_report(out, b, reps=50, figures=False)
    _drop_run(a, "ppo", 1)  # a finished ppo seed 0 only, b seed 1 only
    _drop_run(b, "ppo", 0)
    _drop_run(b, "dqn", 0, final=123.0)  # both finished dqn seed 0: b, the later folder, counts
    assert [r["status"] for r in report.collect(a).runs if r["algo"] == "ppo"] == ["done", "queued"]
    subprocess.run([*CLI, "report", str(a), str(b), "--out", str(a), "--no-figures", "--reps", "50"],
                   check=True, capture_output=True, cwd=ROOT)
    merged, whole = report.collect(a), report.collect(out)
    finals = {(r["algo"], r["seed"]): r["final_return"] for r in merged.runs}
    assert finals == {**{(r["algo"], r["seed"]): r["final_return"] for r in whole.runs}, ("dqn", 0): 123.0}
    assert all(r["status"] == "done" for r in merged.runs)
    assert [r for r in merged.evals if r["algo"] == "ppo"] == [r for r in whole.evals if r["algo"] == "ppo"]

    other = tmp_path / "other"
    (other / "runs").mkdir(parents=True)
    (other / "suite.yaml").write_text(yaml.safe_dump({**TINY, "name": "tiny2"}))
    with pytest.raises(UserError, match="different suites"):
        report.write_report([a, other], tmp_path / "c")
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_the_published_results_page_is_what_the_report_writes():
    """docs/results.md is generated: from the committed results folders by `corral report
    benchmarks/results/* --page docs/results.md`."""
    folders = sorted(p for p in (ROOT / "benchmarks" / "results").iterdir() if (p / "runs.csv").is_file())
    assert folders, "no committed results under benchmarks/results/"
    expected = report.page_text(folders)
    assert (ROOT / "docs" / "results.md").read_text() == expected, \
        "docs/results.md differs from the report: run `corral report benchmarks/results/* --page docs/results.md`"


# --- estimates


def test_the_estimate_adds_the_warm_up_the_learning_phase_and_the_evaluations():
    from corral.bench import estimate
    from corral.bench.suite import Run

    run = Run("dqn", "CartPole-v1", 0, 20000, (("eval.every", 5000), ("eval.episodes", 10)))
    assert estimate.evaluations(run) == 5  # 4 periodic + the final one
    speed = estimate.Speed(learn_sps=100.0, warmup_sps=1000.0, learning_starts=2000, eval_s=3.0)
    # 2,000 steps at 1,000/s, 18,000 at 100/s, 5 evaluations of 3 s
    assert estimate.seconds(speed, run, 5) == pytest.approx(2.0 + 180.0 + 15.0)
    assert estimate.seconds(estimate.Speed(learn_sps=100.0), run, 0) == pytest.approx(200.0)


def test_the_dry_run_estimate_is_within_30_percent_of_the_cpu_the_run_then_spends(tmp_path):
    """The probe (as `corral bench --dry-run --probe` runs it, in a process of its own) against
    the same run through `corral bench`, in CPU seconds. DQN on CartPole: acting alone before
    learning_starts, then a gradient step every 4 env steps."""
    from corral.bench import estimate

    data = {"name": "est", "seeds": 1, "eval": {"episodes": 5, "points": 2},
            "grid": [{"algos": ["dqn"], "envs": ["CartPole-v1"], "steps": 20000,
                      "set": {"tensorboard": False, "dqn.learning_starts": 4000}}]}
    suite = write_suite(tmp_path, data)
    (run,) = load_suite(suite).runs()
    speed = estimate.probe_apart(run, 3.0)
    assert speed.warmup_sps > 2 * speed.learn_sps and 4000 <= speed.learning_starts <= 4200
    predicted = estimate.seconds(speed, run, estimate.evaluations(run))
    r = bench(suite, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    spent = runner.read_json(tmp_path / "out" / "runs" / run.name / "result.json")["cpu_s"]
    assert 0.7 < predicted / spent < 1.3, (predicted, spent, speed)
    r = subprocess.run([*CLI, "bench", str(suite), "--dry-run", "--probe", "2"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0 and "dqn-CartPole-v1-s0" in r.stdout and "CPU-hours" in r.stdout


def test_a_run_killed_after_its_last_checkpoint_but_before_its_result_is_finished_on_rerun(tmp_path):
    data = {**TINY, "seeds": 1, "grid": [TINY["grid"][1]]}
    s = parse_suite(data)
    (run,) = s.runs()
    out = tmp_path / "out"
    execute.prepare(s, out, [run])
    d = execute.run_dir(out, run)
    assert runner.run(d) == 0
    result = runner.read_json(d / "result.json")
    (d / "result.json").unlink()  # as if killed right after the final checkpoint
    assert runner.run(d) == 0
    again = runner.read_json(d / "result.json")
    assert again["eval_return"] == result["eval_return"] and again["env_steps"] == 4000
    steps = [r["step"] for r in report.collect(out).evals]  # one row per evaluation step
    assert steps == [1024, 2048, 3072, 4000]  # a gradient step every 4 env steps: evaluations after one


def test_the_live_table_shows_each_runs_state_steps_and_latest_evaluation(uninterrupted, tmp_path):
    from rich.console import Console

    from corral.bench.progress import Table

    suite, out = uninterrupted
    runs = load_suite(suite).runs()
    table = Table(out, runs, live=False)
    row = table.row(runs[0], {})
    final = runner.read_json(out / "runs" / runs[0].name / "result.json")["eval_return"]
    assert row[:3] == (runs[0].name, "done", "32,768/32,768") and row[4] == f"{final:.1f}"
    # a run with a fresh status and no result is running, with an ETA from its speed
    d = tmp_path / "runs" / runs[0].name
    d.mkdir(parents=True)
    runner.write_json(d / "status.json", {"state": "running", "steps": 16384, "steps_per_s": 8192.0, "eval": 12.5,
                                          "time": time.time()})
    row = Table(tmp_path, runs[:1], live=False).row(runs[0], {})
    assert row[1:] == ("running", "16,384/32,768", "8,192", "12.5", "0:02")
    console = Console(record=True, width=160)
    console.print(table.render({}))
    assert "4 done" in console.export_text()
