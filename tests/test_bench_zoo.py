"""Suites that run rl-zoo's own hyperparameter entries (``zoo: true`` in a grid block, as
``corral train ALGO ENV --zoo``) and show a peer's figure from another env id, marked."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from corral.bench import report
from corral.bench.suite import parse_suite
from corral.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())"]
needs_zoo = pytest.mark.skipif(importlib.util.find_spec("rl_zoo3") is None, reason="needs corral[zoo] (rl_zoo3)")


@needs_zoo
def test_a_zoo_block_takes_the_budget_from_rl_zoos_entry_and_marks_its_runs():
    s = parse_suite({"grid": [{"algos": ["ppo"], "envs": ["CartPole-v1"], "zoo": True},
                              {"algos": ["dqn"], "envs": ["CartPole-v1"]}]})
    budgets = {f"{a}/{e}": n for a, e, n, _ in s.cells}
    assert budgets == {"ppo/CartPole-v1": 100000, "dqn/CartPole-v1": 50000}  # rl-zoo's n_timesteps; the preset's
    specs = {r.algo: r.spec() for r in s.runs(seeds=[0])}
    assert specs["ppo"]["zoo"] == "strict" and "zoo" not in specs["dqn"]  # a preset run's spec is as before


@needs_zoo
def test_a_strict_zoo_cell_with_keys_corral_cannot_honour_is_refused_before_any_run():
    block = {"algos": ["crossq"], "envs": ["MountainCarContinuous-v0"], "zoo": True}  # gSDE, not in crossq
    with pytest.raises(UserError, match="use_sde.*zoo: lenient"):
        parse_suite({"grid": [block]})
    s = parse_suite({"grid": [{**block, "zoo": "lenient"}]})
    assert s.cells[0][2] == 50000 and s.runs(seeds=[0])[0].zoo == "lenient"


def test_a_bad_zoo_value_is_refused_with_the_key_named():
    with pytest.raises(UserError, match="zoo: expected true, false or lenient, got 'yes please'"):
        parse_suite({"grid": [{"algos": ["ppo"], "envs": ["CartPole-v1"], "zoo": "yes please"}]})


@needs_zoo
def test_a_zoo_run_trains_with_rl_zoos_hyperparameters(tmp_path):
    suite = tmp_path / "z.yaml"
    suite.write_text(yaml.safe_dump({"name": "z", "seeds": [0], "eval": {"episodes": 2, "points": 1},
                                     "grid": [{"algos": ["ppo"], "envs": ["CartPole-v1"], "zoo": True,
                                               "steps": 512, "set": {"tensorboard": False}}]}))
    r = subprocess.run([*CLI, "bench", suite, "--out", tmp_path / "out", "--no-live"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load((tmp_path / "out" / "runs" / "ppo-CartPole-v1-s0" / "config.yaml").read_text())
    algo = cfg["ppo"]
    # rl-zoo's ppo.yml CartPole-v1 entry: 8 envs, n_steps 32, gamma 0.98, 20 epochs, linear schedules
    assert cfg["env"]["num_envs"] == 8 and cfg["steps"] == 512
    assert (algo["n_steps"], algo["gamma"], algo["n_epochs"], algo["lr_schedule"]) == (32, 0.98, 20, "linear")


def test_the_report_shows_a_peer_figure_from_another_env_id_only_where_the_suite_names_it():
    grid = [{"algos": ["a2c"], "envs": ["LunarLander-v3"], "steps": 200000}]

    def table_row(envs: dict) -> str:
        s = parse_suite({"name": "t", "seeds": [0], "peers": ["rl-zoo"], "envs": envs, "grid": grid})
        text = report.markdown(report.Results(s, "", {}, [], []), reps=50)
        return next(line for line in text.splitlines() if line.startswith("| LunarLander-v3 | a2c"))

    assert table_row({}).endswith("| - |")  # rl-zoo's figure is on LunarLander-v2: not a v3 result
    row = table_row({"LunarLander-v3": {"peer_env": "LunarLander-v2"}})
    assert "rl-zoo 155.751" in row and "on LunarLander-v2" in row


def test_committed_zoo_results_read_without_rl_zoo3(monkeypatch):
    """A results folder keeps the zoo cells' budgets (meta.json), so `corral report` and the results page
    work where rl_zoo3 is not installed; reading the suite itself there is refused with the fix."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rl_zoo3" else real(name, *a))
    res = report.collect(ROOT / "benchmarks" / "results" / "zoo")
    budgets = {f"{a}/{e}": n for a, e, n, _ in res.suite.cells}
    assert budgets["td3/LunarLanderContinuous-v3"] == 300000 and budgets["tqc/BipedalWalker-v3"] == 500000
    with pytest.raises(UserError, match=r"corral\[zoo\]"):
        parse_suite(yaml.safe_load((ROOT / "benchmarks" / "results" / "zoo" / "suite.yaml").read_text()))
