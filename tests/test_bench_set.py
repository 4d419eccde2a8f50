"""``corral bench --set KEY=VALUE``: keys for every run of a suite, over the suite's own; part of
each run's spec (a rerun without them is refused), refused before anything starts when no run
can take them, and named by the report with the command that reruns them."""

from __future__ import annotations

import yaml

from corral.bench import report
from corral.bench.suite import parse_suite
from tests.test_bench import bench

SUITE = {
    "name": "tinyset",
    "seeds": 1,
    "eval": {"episodes": 2, "points": 2},
    "envs": {"CartPole-v1": {"random": 22.0, "reference": 500.0}},
    "grid": [{"algos": ["dqn"], "envs": ["CartPole-v1"], "steps": 1200,
              "set": {"tensorboard": False, "dqn.learning_starts": 500, "dqn.lr": 0.002}}],
}


def test_given_keys_go_over_the_suites_into_every_run_and_its_spec():
    suite = parse_suite(SUITE)
    plain, = suite.runs()
    given, = suite.runs(given={"dqn.lr": 0.0005, "matmul": "bfloat16"})
    assert report.given_text({"dqn.hidden": [32, 32], "compile": True}) == "--set compile=true --set dqn.hidden=[32,32]"
    assert dict(plain.sets)["dqn.lr"] == 0.002 and "matmul" not in dict(plain.sets)
    assert dict(given.sets)["dqn.lr"] == 0.0005 and dict(given.sets)["matmul"] == "bfloat16"
    assert dict(given.sets)["dqn.learning_starts"] == 500  # the suite's other keys stay
    assert "given" not in plain.spec()  # a run without --set keeps the spec it always had
    assert given.spec()["given"] == {"dqn.lr": 0.0005, "matmul": "bfloat16"}


def test_a_key_no_run_can_take_is_refused_before_any_run_directory_is_made(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    out = tmp_path / "out"
    r = bench(path, "--out", out, "--set", "dqn.no_such_key=1")
    assert r.returncode != 0
    assert "dqn/CartPole-v1 with --set dqn.no_such_key=1" in r.stderr and "no_such_key" in r.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


def test_a_run_with_given_keys_uses_them_a_rerun_without_them_is_refused_and_the_report_names_them(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    out = tmp_path / "out"
    r = bench(path, "--out", out, "--set", "dqn.lr=0.0005", "--set", "dqn.batch_size=16")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = out / "runs" / "dqn-CartPole-v1-s0"
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["dqn"]["lr"] == 0.0005 and cfg["dqn"]["batch_size"] == 16

    again = bench(path, "--out", out)  # the suite without the keys: another experiment
    assert again.returncode != 0 and "another spec" in again.stderr and "given" in again.stderr

    rerun = bench(path, "--out", out, "--set", "dqn.batch_size=16", "--set", "dqn.lr=0.0005")  # same keys
    assert rerun.returncode == 0 and "1 of 1 runs done" in rerun.stdout

    res = report.collect(out)
    assert res.runs[0]["given"] == "--set dqn.batch_size=16 --set dqn.lr=0.0005"
    text = report.markdown(res, reps=50)
    assert f"`corral bench {path} --set dqn.batch_size=16 --set dqn.lr=0.0005 --out bench/tinyset" in text
    assert "Keys given with `corral bench --set`" in text
    # the committed results folder keeps them: its report reads the same back
    folder = tmp_path / "results"
    report.write_report([out], folder, reps=50, figures=False)
    assert report.collect(folder).runs[0]["given"] == res.runs[0]["given"]
