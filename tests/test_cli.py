import json
import os
import subprocess
import sys

import pytest

from corral.cli import main

QUICK = ["--set", "eval.episodes=2", "--set", "tensorboard=false"]


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_console_script_trains_and_prints_a_json_summary_last(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "corral.cli", "train", "ppo", "CartPole-v1", "--steps", "512", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))},
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"run_dir", "env_steps", "train_seconds", "episodes", "last20_return"} <= set(summary)
    assert summary["env_steps"] >= 512 and summary["episodes"] > 0
    run_dir = tmp_path / summary["run_dir"]
    assert run_dir.name.startswith("ppo-CartPole-v1-s0-")
    assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").is_file()
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    assert list((run_dir / "tb").glob("events.*")), "TensorBoard events are written"


def test_eval_resume_plot_and_list_on_a_run(tmp_path, capsys):
    rd = str(tmp_path / "r")
    rc, out, _ = run(capsys, "train", "ppo", "CartPole-v1", "--steps", "512", "--run-dir", rd, "--json", *QUICK)
    assert rc == 0
    rc, out, _ = run(capsys, "eval", rd, "--episodes", "3", "--json")
    res = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and res["episodes"] == 3 and res["mean_return"] > 0 and "std_return" in res
    rc, out, _ = run(capsys, "resume", rd, "--steps", "1024", "--json")
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["env_steps"] == 1024
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_return" in r for r in rows) and any("pg_loss" in r for r in rows)
    rc, out, _ = run(capsys, "plot", rd, "--out", str(tmp_path / "c.png"))
    assert rc == 0 and (tmp_path / "c.png").stat().st_size > 1000
    # a run with only its final evaluation: one panel, the evaluation a marker beside the curve
    one = tmp_path / "one"
    one.mkdir()
    first = next(i for i, r in enumerate(rows) if "eval_return" in r)
    (one / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:first + 1]))
    assert run(capsys, "plot", str(one), "--out", str(tmp_path / "one.png"))[0] == 0
    from matplotlib.image import imread

    assert imread(tmp_path / "c.png").shape[1] > 1.5 * imread(tmp_path / "one.png").shape[1]
    rc, out, _ = run(capsys, "list")
    assert rc == 0 and "ppo" in out and "CartPole-v1" in out
    rc, out, _ = run(capsys, "list", "--options", "ppo")
    assert "ppo.gae_lambda" in out and "GAE lambda" in out


def test_list_options_of_a_variant_shows_the_variants_own_defaults(capsys):
    """`corral list --options rainbow` shows what a rainbow run uses (n_step 3, PER, noisy), not C51's."""
    rc, out, _ = run(capsys, "list", "--options", "rainbow")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}
    assert rc == 0 and rows["algo"] == "rainbow"
    assert rows["rainbow.n_step"] == "3" and rows["rainbow.prioritized"] == "True" and rows["rainbow.noisy"] == "True"
    rc, out, _ = run(capsys, "list", "--options", "c51")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}
    assert rows["c51.n_step"] == "1" and rows["c51.noisy"] == "False"


@pytest.mark.parametrize("argv,needle", [
    (["train", "ppp", "CartPole-v1"], "unknown algorithm 'ppp'; did you mean ppo"),
    (["train", "ppo", "CartPol-v1"], "unknown env 'CartPol-v1'; did you mean CartPole-v1"),
    (["train", "ppo", "CartPole-v1", "--set", "ppo.lrr=1"], "nearest valid keys: ppo.lr"),
    (["train", "ppo", "CartPole-v1", "--set", "ppo.n_epochs=two"], "ppo.n_epochs: expected int"),
    (["train", "ppo", "CartPole-v1", "--set", "ppo.n_epochs=-3"], "ppo.n_epochs: -3 is out of range; it must be >= 1"),
    (["train", "ppo", "CartPole-v1", "--set", "gamma=1.5"], "ppo.gamma: 1.5 is out of range; it must be in [0, 1]"),
    (["train", "ppo", "CartPole-v1", "--set", "env.backend=subprocess"], "did you mean 'subproc'?"),
    (["train", "ppo", "CartPole-v1", "--set", "learnig_rate=1"], "nearest valid keys: ppo.lr"),
    (["train", "ppo", "CartPole-v1", "--steps", "0"], "config steps: 0 is out of range"),
    (["train", "ppo", "CartPole-v1", "--device", "cuda:7"], "no GPU is visible"),
    (["eval", "does/not/exist"], "does not exist"),
    (["resume", "does/not/exist"], "has no checkpoints/latest.pt"),
])
def test_bad_input_gives_one_message_a_nonzero_exit_and_no_run_dir(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    if "cuda:7" in argv:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is visible")
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def hide_box2d(monkeypatch):
    """Make Box2D look uninstalled, whether or not this machine has it."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)


def test_missing_env_package_names_the_extra_to_install(tmp_path, capsys, monkeypatch):
    hide_box2d(monkeypatch)
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, "train", "ppo", "LunarLander-v3", "--steps", "100")
    assert rc == 2 and "pip install 'corral[box2d]'" in err


def test_an_existing_run_directory_is_never_overwritten(tmp_path, capsys):
    rd = tmp_path / "r"
    rd.mkdir()
    (rd / "precious.txt").write_text("keep me")
    rc, _, err = run(capsys, "train", "ppo", "CartPole-v1", "--steps", "256", "--run-dir", str(rd))
    assert rc == 2 and "already exists" in err and "corral resume" in err
    assert sorted(p.name for p in rd.iterdir()) == ["precious.txt"]


def test_env_producing_nan_stops_training_with_the_env_named(tmp_path, capsys):
    rc, _, err = run(capsys, "train", "ppo", "envs_for_tests:make_count_env", "--steps", "2000",
                     "--run-dir", str(tmp_path / "r"), "--set", "env.kwargs.length=100",
                     "--set", "env.kwargs.bad_step=40", "--set", "env.kwargs.bad=nan_obs", *QUICK)
    assert rc == 1
    assert "'envs_for_tests:make_count_env' (index 0)" in err and "non-finite observation" in err


def test_eval_writes_one_video_per_episode(tmp_path, capsys):
    pytest.importorskip("imageio_ffmpeg")
    rd = str(tmp_path / "r")
    assert main(["train", "ppo", "CartPole-v1", "--steps", "256", "--run-dir", rd, *QUICK]) == 0
    rc, out, err = run(capsys, "eval", rd, "--episodes", "2", "--video", str(tmp_path / "v"), "--json")
    assert rc == 0
    files = sorted((tmp_path / "v").glob("*.mp4"))
    assert len(files) == 2 and all(f.stat().st_size > 1000 for f in files)
    assert json.loads(out.strip().splitlines()[-1])["episodes"] == 2


def test_training_stops_once_a_periodic_evaluation_reaches_the_bar(tmp_path, capsys):
    assert main(["train", "ppo", "CartPole-v1", "--steps", "60000", "--seed", "0", "--run-dir", str(tmp_path / "r"),
                 "--set", "eval.every=2048", "--set", "eval.episodes=3", "--set", "eval.stop_at_return=60",
                 "--set", "tensorboard=false", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    evals = [(m["step"], m["eval_return"]) for m in map(json.loads, (tmp_path / "r" / "metrics.jsonl").open())
             if "eval_return" in m]
    first = next(i for i, (_, r) in enumerate(evals) if r >= 60)
    assert summary["stopped_early"] and summary["env_steps"] < 60000
    assert evals[first][0] == summary["env_steps"]  # stopped at the first evaluation to reach it
    assert len(evals) == first + 2  # then only the final evaluation


def test_list_options_shows_ranges(capsys):
    rc, out, _ = run(capsys, "list", "--options", "ppo")
    assert rc == 0
    assert any(line.split()[0] == "ppo.gamma" and line.endswith("[in [0, 1]]") for line in out.splitlines())


def test_a_closed_pipe_ends_list_quietly():
    """`corral list --options ppo | head -1`: the reader is gone before corral writes (a pipe
    closed at once, so the test does not race head), and corral exits without a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli", "list", "--options", "ppo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))},
    )
    proc.stdout.close()
    err = proc.stderr.read()
    rc = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 141


def test_list_piped_into_head_prints_its_first_line():
    proc = subprocess.run(
        f"{sys.executable} -m corral.cli list --options ppo | head -1", shell=True, capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))},
    )
    assert proc.stdout.split()[:2] == ["algo", "ppo"]
    assert "Traceback" not in proc.stderr, proc.stderr
