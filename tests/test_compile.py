"""``compile: true``: a run's updates use the compiled kernels (corral/kernels/compiled.py),
acting and evaluation do not, and a machine that cannot compile is refused before the run
starts. The compiled kernel's numbers are checked against the readable loss in
tests/test_kernels.py (``quantile_huber_fused``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from corral.errors import UserError
from corral.kernels import compiled as C
from corral.kernels import quantile
from corral.train.learner import Learner
from corral.train.setup import build_config

ROOT = Path(__file__).resolve().parent.parent


def _tqc(compile_: bool, steps: int = 400):
    return build_config("tqc", "Pendulum-v1", steps=steps, seed=3, sets=[
        "progress=false", "tensorboard=false", "eval.episodes=0", "tqc.learning_starts=200",
        "tqc.batch_size=32", "tqc.hidden=[32,32]", f"compile={str(compile_).lower()}"])


def test_a_run_with_compile_takes_the_fused_kernel_in_every_update_and_only_there(monkeypatch):
    calls = {"update": 0, "outside": 0}

    def fake_compiled(fn):  # stands for torch.compile: counts where the fused kernel is asked for
        def run(*args):
            calls["update" if C.compiling() else "outside"] += 1
            return fn(*args)
        return run

    monkeypatch.setattr(quantile, "compiled", fake_compiled)
    learner = Learner(_tqc(True), None)
    learner.train()
    assert calls["update"] == 201 and calls["outside"] == 0  # one per gradient step: env steps 200 to 400
    assert not C.compiling()  # the mode ends with the update

    calls["update"] = 0
    Learner(_tqc(False), None).train()
    assert calls["update"] == 0


def test_compile_true_follows_the_eager_run_closely():
    """Not bit for bit (another rounding of the same sums), but the same training: after 200
    gradient steps the critics of the two runs agree to a few parts in a thousand."""
    eager, fused = Learner(_tqc(False), None), Learner(_tqc(True), None)
    eager.train()
    fused.train()
    for a, b in zip(eager.algo.critics.parameters(), fused.algo.critics.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=5e-3 * a.abs().max().item())
    assert any(not torch.equal(a, b) for a, b in zip(eager.algo.critics.parameters(),
                                                     fused.algo.critics.parameters()))


def test_without_a_compiler_compile_true_is_refused_before_the_run_starts(monkeypatch, tmp_path):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="compile=true: torch.compile on a CPU needs a C\\+\\+ compiler"):
        Learner(_tqc(True), None)
    Learner(_tqc(False, steps=10), None)  # the default needs none

    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = str(tmp_path)  # no g++, c++ or clang++ on it
    r = subprocess.run([sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())",
                        "train", "tqc", "Pendulum-v1", "--steps", "500", "--set", "compile=true",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode != 0 and "needs a C++ compiler" in r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
