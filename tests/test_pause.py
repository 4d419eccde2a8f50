"""Stopping a run without losing it: ``Learner.pause`` (the first SIGINT / SIGTERM under
``corral train``, ``corral resume`` and ``corral bench``) ends the run at an update boundary
with a checkpoint, and resuming it gives the run that never stopped, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkpoint_state import assert_same_checkpoint

from corral.train.checkpoint import load_checkpoint
from corral.train.learner import Learner
from corral.train.pause import pause_on_signals
from corral.train.resume import resume_learner
from corral.train.setup import build_config

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())"]
QUIET = ["progress=false", "tensorboard=false"]
# PPO: rollouts of 2 x 32 steps, evaluations every 256 steps (their schedule crosses the pause)
PPO = ["ppo.n_steps=32", "ppo.batch_size=32", "ppo.n_epochs=2", "env.num_envs=2", "ppo.normalize_obs=true",
       "eval.every=256", "eval.episodes=2", "checkpoint.every=100000", *QUIET]
# SAC: a replay buffer and gradient steps every 4 env steps, the temperature tuned
SAC = ["sac.learning_starts=100", "sac.batch_size=32", "sac.hidden=[32,32]", "sac.train_freq=4",
       "sac.gradient_steps=2", "eval.episodes=0", "checkpoint.every=100000", *QUIET]


def straight_run(algo: str, env: str, steps: int, seed: int, sets: list[str], run_dir: Path) -> dict:
    learner = Learner(build_config(algo, env, steps=steps, seed=seed, sets=sets), run_dir)
    (run_dir / "checkpoints").mkdir(parents=True)
    return learner.train()


@pytest.mark.parametrize("algo,env,steps,pause_after,sets", [
    ("ppo", "CartPole-v1", 1024, 5, PPO),
    ("sac", "Pendulum-v1", 400, 40, SAC),
])
def test_a_paused_run_resumed_equals_the_run_that_never_stopped(tmp_path, algo, env, steps, pause_after, sets):
    """Pause after some updates (between the periodic checkpoints), resume to the budget: the
    final parameters, optimizer moments, normalizers, random streams and evaluations are those
    of the uninterrupted run; the pause wrote no final evaluation and the summary says paused."""
    ref = straight_run(algo, env, steps, 5, sets, tmp_path / "ref")
    assert not ref["paused"]

    run = tmp_path / "paused"
    learner = Learner(build_config(algo, env, steps=steps, seed=5, sets=sets), run)
    (run / "checkpoints").mkdir(parents=True)
    learner.start()
    for _ in range(pause_after):
        learner.step()
    learner.pause()  # as the signal handler does, between two updates
    while learner.step() is not None and not learner.done():
        pass
    summary = learner.close()
    at = summary["env_steps"]
    assert summary["paused"] and not summary["stopped_early"] and 0 < at < steps
    assert not (run / "eval.json").exists()  # no final evaluation at a pause
    assert load_checkpoint(run / "checkpoints" / "latest.pt")["counters"]["env_steps"] == at

    resumed = resume_learner(run, progress=False).train()
    assert not resumed["paused"] and resumed["env_steps"] == ref["env_steps"] == steps
    assert_same_checkpoint(run / "checkpoints" / "latest.pt", tmp_path / "ref" / "checkpoints" / "latest.pt")
    if algo == "ppo":
        assert resumed["eval_return"] == ref["eval_return"]
        assert len(eval_history(run)) >= 3 and eval_history(run) == eval_history(tmp_path / "ref")


def eval_history(run: Path) -> list[tuple[int, float]]:
    """(step, evaluation return) of every evaluation the run's metrics recorded, in order."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval_return"]) for r in rows if "eval_return" in r]


class Dummy:
    run_dir = None

    def __init__(self):
        self.pauses = 0

    def pause(self):
        self.pauses += 1


def test_the_first_signal_pauses_and_the_second_aborts_and_the_old_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    learner = Dummy()
    with pytest.raises(KeyboardInterrupt):
        with pause_on_signals(learner, announce=False) as seen:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs in the main thread, between two bytecodes
            assert learner.pauses == 1 and seen.signum == signal.SIGTERM and seen.exit_code == 143
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            pytest.fail("the second signal did not abort")
    assert learner.pauses == 1
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def wait_for(path: Path, test, timeout: float = 120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file():
            try:
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            except ValueError:
                rows = []
            if test(rows):
                return rows
        time.sleep(0.05)
    pytest.fail(f"{path}: not reached within {timeout} s")


def test_sigterm_to_corral_train_pauses_with_a_checkpoint_and_corral_resume_finishes_it_exactly(tmp_path):
    """``kill`` (SIGTERM) of a running ``corral train``: exit code 143, the way to continue on
    stderr, a checkpoint at the pause, no final evaluation; ``corral resume`` then ends where
    the uninterrupted run does, bit for bit."""
    steps, sets = 20_000, [*PPO, "log_every=256", "eval.every=5000"]
    run = tmp_path / "killed"
    proc = subprocess.Popen([*CLI, "train", "ppo", "CartPole-v1", "--steps", str(steps), "--seed", "2",
                             "--run-dir", str(run), *sum((["--set", s] for s in sets), [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    wait_for(run / "metrics.jsonl", lambda rows: len(rows) >= 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert f"corral resume {run}" in err and "SIGTERM" in err
    at = load_checkpoint(run / "checkpoints" / "latest.pt")["counters"]["env_steps"]
    assert 0 < at < steps and not (run / "eval.json").exists()

    r = subprocess.run([*CLI, "resume", str(run), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["env_steps"] == steps
    straight_run("ppo", "CartPole-v1", steps, 2, sets, tmp_path / "ref")
    assert_same_checkpoint(run / "checkpoints" / "latest.pt", tmp_path / "ref" / "checkpoints" / "latest.pt")
