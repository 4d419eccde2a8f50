"""One run of a suite, in its own process: ``python -m corral.bench.runner RUN_DIR``.

The run directory is an ordinary one (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``,
``eval.json``) plus what the harness keeps beside it:

- ``spec.json``: what the run is (algo, env, seed, budget, config keys), written by the driver;
- ``bench.json``: the code it ran on (corral version, git commit), attempts, code changes;
- ``evals.jsonl``: one row per evaluation: ``step, wall_s, cpu_s, return, return_std, episodes``;
- ``status.json``: steps, steps/s and the latest evaluation, rewritten every few seconds;
- ``result.json``: written last; its presence means the run is finished.

Starting again continues: a finished run is left alone, a run with ``checkpoints/latest.pt``
resumes from it (exact resume: the same final parameters as a run never stopped), any other
starts from scratch. A run whose recorded code differs from this process's is refused (exit
code ``REFUSED``) unless ``--allow-code-change``; then the change is recorded and the report
marks the run. A lock file keeps two processes off one run directory (exit code ``BUSY``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

REFUSED = 3  # the run's code differs from this process's (not retried)
BUSY = 75  # another process holds the run (not retried now)
STOPPED = 76  # paused by SIGINT / SIGTERM with a checkpoint: unfinished, not failed (the next call resumes it)
# where the run is: the Ray node a task ran on (set by the driver's task), else the host
NODE = os.environ.get("CORRAL_BENCH_NODE") or os.uname().nodename


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, data) -> None:
    """Atomic: a reader (the driver's live table, a report) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by a kill mid-write
            continue
    return rows


def keep_rows_upto(path: Path, step: int) -> None:
    """Drop the rows past ``step`` (written after the checkpoint a resumed run restarts from:
    the resumed run writes them again, the same)."""
    if path.is_file():
        rows = [r for r in read_rows(path) if r.get("step", 0) <= step]
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, path)


class BenchHook:
    """Called after every update: records each evaluation with wall and CPU seconds, the CPU
    seconds at each checkpoint (so a resumed run counts on from there), and a status file."""

    def __init__(self, run_dir: Path, cpu_offset: float, status_every: float = 2.0):
        self.run_dir = run_dir
        self.cpu_offset = cpu_offset
        self.cpu0 = time.process_time()
        self.status_every = status_every
        self.last_status = 0.0
        self.last_eval_step = -1
        self.last_ckpt = None
        self.t0, self.s0 = time.perf_counter(), None

    def cpu_s(self) -> float:
        return self.cpu_offset + time.process_time() - self.cpu0

    def record_eval(self, learner, result: dict) -> None:
        row = {"step": learner.env_steps, "wall_s": round(learner.train_seconds, 3), "cpu_s": round(self.cpu_s(), 3),
               "return": result["mean_return"], "return_std": result["std_return"], "episodes": result["episodes"]}
        with open(self.run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.last_eval_step = learner.env_steps

    def __call__(self, learner, stats: dict) -> None:
        if self.s0 is None:
            self.s0 = learner.env_steps
            self.last_ckpt = learner.next_ckpt
        ev = learner._evaluator
        if ev is not None and ev.last_step == learner.env_steps and learner.env_steps != self.last_eval_step:
            self.record_eval(learner, learner.last_eval)
        if learner.next_ckpt != self.last_ckpt:  # the checkpoint hook wrote latest.pt at this update
            self.last_ckpt = learner.next_ckpt
            write_json(self.run_dir / "cpu.json", {"step": learner.env_steps, "cpu_s": self.cpu_s()})
        now = time.perf_counter()
        if now - self.last_status >= self.status_every:
            self.last_status = now
            self.write_status(learner)

    def write_status(self, learner, state: str = "running") -> None:
        elapsed = time.perf_counter() - self.t0
        sps = (learner.env_steps - (self.s0 or 0)) / elapsed if elapsed > 0 else 0.0
        write_json(self.run_dir / "status.json", {
            "state": state, "steps": learner.env_steps, "total": learner.cfg.steps, "steps_per_s": sps,
            "eval": learner.last_eval["mean_return"] if learner.last_eval else None,
            "cpu_s": self.cpu_s(), "pid": os.getpid(), "node": NODE, "time": time.time()})

    def close(self, learner) -> None:
        pass


def run(run_dir: Path, allow_code_change: bool = False) -> int:
    """Run (or continue) the run in ``run_dir``; the exit code for the driver."""
    run_dir = Path(run_dir)
    with open(run_dir / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{run_dir}: another process is running it", file=sys.stderr)
            return BUSY
        return _run(run_dir, allow_code_change)


def _run(run_dir: Path, allow_code_change: bool) -> int:
    from corral.bench.provenance import code_identity
    from corral.errors import UserError

    if (run_dir / "result.json").is_file():
        return 0
    spec = read_json(run_dir / "spec.json")
    if spec is None:
        raise UserError(f"{str(run_dir)!r} has no spec.json: it is not a run of a suite")
    code = code_identity()
    bench = read_json(run_dir / "bench.json", {})
    ckpt = run_dir / "checkpoints" / "latest.pt"
    resuming = ckpt.is_file()
    if resuming and bench.get("code", {}).get("id") != code["id"]:
        was = bench.get("code", {}).get("id")
        if not allow_code_change:
            print(f"{run_dir.name}: its checkpoint was written by corral {was}, this is {code['id']}; resuming on "
                  "other code makes it a different experiment. Rerun with --allow-code-change to continue it "
                  "anyway (the report marks it), or delete the run directory to start it again.", file=sys.stderr)
            return REFUSED
        bench.setdefault("code_changes", []).append({"from": was, "to": code["id"], "at_step": None})
    bench.setdefault("code", code)
    bench["attempts"] = bench.get("attempts", 0) + 1
    bench["started"] = time.time()
    write_json(run_dir / "bench.json", bench)

    if resuming:
        from corral.train.resume import resume_learner

        # a run killed between its last checkpoint and result.json is at its budget: train()
        # then runs the final evaluation and checkpoint again (the same) and it is done
        learner = resume_learner(run_dir, steps=int(spec["steps"]), progress=False, quiet=True, finished_ok=True)
        step = learner.env_steps
        if bench.get("code_changes") and bench["code_changes"][-1]["at_step"] is None:
            bench["code_changes"][-1]["at_step"] = step
            write_json(run_dir / "bench.json", bench)
        for name in ("evals.jsonl", "metrics.jsonl"):
            keep_rows_upto(run_dir / name, step)
        saved = read_json(run_dir / "cpu.json", {})
        # CPU seconds at the checkpoint; a checkpoint with no record (killed between the two
        # writes) counts the wall seconds of training, which one thread makes close
        cpu_offset = saved["cpu_s"] if saved.get("step") == step else learner.train_seconds
    else:
        from corral import config as C
        from corral.train.learner import Learner

        for name in ("evals.jsonl", "metrics.jsonl", "cpu.json", "status.json", "eval.json"):
            (run_dir / name).unlink(missing_ok=True)
        _clear(run_dir / "tb")
        _clear(run_dir / "checkpoints")
        from corral.train.setup import build_config

        cfg = build_config(spec["algo"], spec["env"], steps=int(spec["steps"]), seed=int(spec["seed"]),
                           overrides=spec.get("set", {}), zoo=bool(spec.get("zoo")),
                           lenient=spec.get("zoo") == "lenient")
        learner = Learner(cfg, None, quiet=True)
        learner.run_dir = run_dir
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "config.yaml").write_text(C.dump_yaml(cfg))
        cpu_offset = 0.0
    hook = BenchHook(run_dir, cpu_offset)
    from corral.train.pause import train_pausable

    summary, paused = train_pausable(learner, [hook], announce=False)
    if paused is not None:  # the checkpoint of the pause, with the CPU seconds up to it
        write_json(run_dir / "cpu.json", {"step": learner.env_steps, "cpu_s": hook.cpu_s()})
        hook.write_status(learner, "stopped")
        print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} stopped by {signal.Signals(paused - 128).name} "
              f"at {learner.env_steps:,} steps with a checkpoint", flush=True)
        return STOPPED
    final = summary.get("eval")
    if final is not None and hook.last_eval_step != learner.env_steps:
        hook.record_eval(learner, final)
    hook.write_status(learner, "done")
    write_json(run_dir / "result.json", {
        "env_steps": learner.env_steps, "train_seconds": summary["train_seconds"], "cpu_s": round(hook.cpu_s(), 3),
        "eval_return": summary.get("eval_return"), "eval_return_std": summary.get("eval_return_std"),
        "episodes": summary["episodes"], "code": code, "finished": time.time()})
    return 0


def _clear(folder: Path) -> None:
    if folder.is_dir():
        for p in sorted(folder.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m corral.bench.runner", description="run one run of a suite")
    p.add_argument("run_dir")
    p.add_argument("--allow-code-change", action="store_true")
    args = p.parse_args(argv)
    from corral.errors import UserError

    try:
        return run(Path(args.run_dir), args.allow_code_change)
    except UserError as e:
        print(f"corral: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
