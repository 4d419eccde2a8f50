"""The Ray-driven parts of corral.population: search (corral tune) and the tournament. One
local Ray (2 CPUs) for the module; tiny trials."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

ray = pytest.importorskip("ray")
pytest.importorskip("optuna")

from corral.cli import main  # noqa: E402
from corral.population.tournament import tournament  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_cli_tune_writes_the_table_runs_and_a_best_yaml_that_trains(tmp_path, capsys):
    out = tmp_path / "search"
    rc = main(["tune", "ppo", "CartPole-v1", "--space", "ppo.lr=loguniform:1e-4:1e-2", "--space",
               "ppo.n_epochs=choice:2,4", "--trials", "2", "--steps", "512", "--iterations", "2",
               "--set", "ppo.n_steps=64", "--set", "tensorboard=false", "--eval-episodes", "2", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "best: trial" in printed and "ppo.lr" in printed
    rows = list(csv.DictReader(open(out / "trials.csv")))
    assert len(rows) == 2
    for r in rows:
        assert 1e-4 <= float(r["ppo.lr"]) <= 1e-2 and r["ppo.n_epochs"] in ("2", "4")
        run = tmp_path / "search" / "runs" / r["trial"]
        assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
        assert (run / "checkpoints" / "latest.pt").is_file()  # an ordinary run directory
        assert yaml.safe_load((run / "config.yaml").read_text())["ppo"]["lr"] == pytest.approx(float(r["ppo.lr"]))
    best = rows[0]
    data = yaml.safe_load((out / "best.yaml").read_text())
    assert data["ppo"]["lr"] == pytest.approx(float(best["ppo.lr"])) and data["steps"] == 512
    assert (out / "tune.png").stat().st_size > 0
    # the preset trains, and reproduces the best trial's final evaluation
    rc = main(["train", "ppo", "CartPole-v1", "--config", str(out / "best.yaml"), "--run-dir", str(tmp_path / "again"),
               "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if best["complete"] == "True":
        assert summary["eval_return"] == pytest.approx(float(best["eval_return"]))
    # bad input: one clear error before Ray starts
    assert main(["tune", "ppo", "CartPole-v1", "--space", "ppo.lrr=loguniform:1e-4:1e-2", "--out",
                 str(tmp_path / "bad")]) == 2
    assert main(["tune", "ppo", "CartPole-v1", "--space", "ppo.lr=loguniform:1e-4:1e-2", "--search", "grid",
                 "--out", str(tmp_path / "bad")]) == 2


def test_tournament_best_never_decreases_beats_the_start_and_survives_a_killed_worker(tmp_path):
    killed = []

    def kill_once(t, result, worker):
        if not killed:  # the worker that was just handed its next job dies in the middle of it
            killed.append(worker)
            ray.kill(t.workers[worker], no_restart=True)

    r = tournament("ppo", "CartPole-v1", workers=2, slices=6, slice_steps=2048, top_k=3, fresh_probability=0.25,
                   eval_episodes=5, seed=0, sets=["ppo.n_steps=64", "ppo.lr_schedule=constant"], out=tmp_path / "t", on_submit=kill_once)
    best = [h["best"] for h in r["history"]]
    print("history", [(h["id"], h["parent"], h["eval"], h["best"]) for h in r["history"]], "start", r["start_eval"])
    assert r["submitted"] == 6 and len(best) == 6
    assert r["restarts"] >= 1 and killed
    assert all(b2 >= b1 for b1, b2 in zip(best, best[1:]))
    assert r["best"]["eval"] > r["start_eval"]
    assert len(r["leaderboard"]) == 3 and [e["eval"] for e in r["leaderboard"]] == sorted(
        (e["eval"] for e in r["leaderboard"]), reverse=True)
    assert any(h["parent"] for h in r["history"])  # agents were taken from the board and trained further
    # resumable: one more slice continues the same board
    again = tournament("ppo", "CartPole-v1", workers=2, slices=7, slice_steps=2048, top_k=3, eval_episodes=5,
                       seed=0, sets=["ppo.n_steps=64", "ppo.lr_schedule=constant"], out=tmp_path / "t", resume=True)
    assert again["submitted"] == 7 and again["history"][:6] == r["history"]
    assert again["best"]["eval"] >= r["best"]["eval"]
    with pytest.raises(Exception, match="resume"):
        tournament("ppo", "CartPole-v1", slices=1, out=tmp_path / "t")


@pytest.mark.slow
def test_tune_ppo_cartpole_finds_a_config_that_solves_it_and_the_yaml_reproduces_it(tmp_path, capsys):
    """`corral tune ppo CartPole-v1` with 8 trials (Optuna TPE, ASHA) over lr and epochs finds a
    config whose deterministic evaluation is >= 475, and `corral train --config best.yaml`
    reproduces it."""
    out = tmp_path / "search"
    assert main(["tune", "ppo", "CartPole-v1", "--space", "ppo.lr=loguniform:1e-4:1e-2", "--space",
                 "ppo.n_epochs=choice:4,10", "--trials", "8", "--steps", "30000", "--iterations", "3",
                 "--set", "tensorboard=false", "--num-cpus", "2", "--out", str(out)]) == 0
    print(capsys.readouterr().out)
    rows = list(csv.DictReader(open(out / "trials.csv")))
    assert len(rows) == 8
    best = rows[0]
    assert best["complete"] == "True" and float(best["eval_return"]) >= 475
    assert main(["train", "ppo", "CartPole-v1", "--config", str(out / "best.yaml"), "--run-dir",
                 str(tmp_path / "again"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print("reproduced:", summary["eval_return"], "trial:", best["eval_return"])
    assert summary["eval_return"] >= 475
