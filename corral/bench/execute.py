"""Running a suite: each run a process of its own (``corral.bench.runner``), locally in a pool
bounded by cores and memory, or as Ray tasks on a cluster with the resources they declare.

Running the same command again continues the suite: the runner skips finished runs and resumes
interrupted ones from their latest checkpoint. A run that fails is retried ``retries`` times,
then reported with the end of its log. The driver holds no state of its own: everything is in
the run directories, so killing it loses nothing but the runs' progress since their last
checkpoint. Stopping it with SIGINT (Ctrl-C) or SIGTERM loses nothing at all: it starts no
more runs and passes a SIGTERM to each running one, which pauses after its current update with
a checkpoint (``corral.train.pause``); a second signal kills them at once.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from corral.bench.runner import BUSY, REFUSED, STOPPED, read_json, write_json
from corral.bench.suite import Run, Suite
from corral.errors import UserError


def run_dir(out: Path, run: Run) -> Path:
    return out / "runs" / run.name


def prepare(suite: Suite, out: Path, runs: list[Run]) -> None:
    """Make each run's directory with its spec; a directory that holds another spec (the suite
    file changed a cell's budget or keys) is refused rather than mixed."""
    from corral.bench.provenance import machine

    (out / "runs").mkdir(parents=True, exist_ok=True)
    if suite.source and Path(suite.source).is_file():
        (out / "suite.yaml").write_text(Path(suite.source).read_text())
    else:
        (out / "suite.yaml").write_text(yaml.safe_dump(suite.raw, sort_keys=False))
    meta = read_json(out / "bench.json", {})
    meta.setdefault("suite", suite.name)
    # how to name the suite again: a built-in by name, a file by its path
    meta.setdefault("suite_arg", suite.name if suite.source and Path(suite.source).parent.name == "suites"
                    and Path(suite.source).parent.parent.name == "bench" else str(suite.source))
    meta.setdefault("machine", machine())
    write_json(out / "bench.json", meta)
    for run in runs:
        d = run_dir(out, run)
        spec = run.spec()
        old = read_json(d / "spec.json")
        if old is not None and old != json.loads(json.dumps(spec)):
            changed = sorted(k for k in spec if old.get(k) != json.loads(json.dumps(spec))[k])
            raise UserError(f"{d} was started with another spec ({', '.join(changed)} differ); the suite changed "
                            "under it. Use another --out, or delete that run directory to start it again")
        if old is None:
            d.mkdir(parents=True, exist_ok=True)
            write_json(d / "spec.json", spec)


def run_state(d: Path, retries: int) -> str:
    """done, failed (retries used up), refused (code changed), or todo."""
    if (d / "result.json").is_file():
        return "done"
    bench = read_json(d / "bench.json", {})
    if bench.get("refused"):
        return "refused"
    if bench.get("failures", 0) > retries:
        return "failed"
    return "todo"


def estimated_memory(suite: Suite, run: Run) -> int:
    """Bytes a run is expected to hold: the suite's measured figure for the cell, else 1 GiB."""
    mb = suite.speeds.get(run.cell, {}).get("rss_mb")
    return int((mb or 1024) * 2**20)


def _die_with_parent() -> None:
    """In the child before exec: killed when the driver dies (Linux), so a killed driver
    leaves no run writing to a directory the next driver resumes."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def runner_command(d: Path, allow_code_change: bool) -> list[str]:
    cmd = [sys.executable, "-m", "corral.bench.runner", str(d)]
    return cmd + (["--allow-code-change"] if allow_code_change else [])


def runner_env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def log_tail(d: Path, lines: int = 8) -> str:
    try:
        text = (d / "log.txt").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def record_exit(d: Path, rc: int) -> str:
    """Book a finished process in the run's bench.json; the run's new state."""
    bench = read_json(d / "bench.json", {})
    if rc == 0:
        return "done" if (d / "result.json").is_file() else "todo"
    if rc == REFUSED:
        bench["refused"] = True
        write_json(d / "bench.json", bench)
        return "refused"
    if rc == BUSY:
        return "busy"
    if rc == STOPPED:  # paused with a checkpoint: the next call resumes it
        return "stopped"
    bench["failures"] = bench.get("failures", 0) + 1
    bench["error"] = log_tail(d)
    write_json(d / "bench.json", bench)
    return "failed"


@dataclass
class Outcome:
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # run name -> the end of its log
    refused: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # paused by a signal, with a checkpoint
    signum: int | None = None  # the signal that stopped the suite
    timed_out: bool = False  # stopped at ``stop_after``


def run_local(suite: Suite, out: Path, runs: list[Run], *, jobs: int, memory: int | None = None,
              retries: int = 2, allow_code_change: bool = False, live: bool = True,
              stop_after: float | None = None) -> Outcome:
    """A pool of at most ``jobs`` runner processes whose estimated memory stays within
    ``memory`` bytes (default: what the machine has available now, less 1 GiB). ``stop_after``
    seconds from now, it stops as on a SIGTERM: the running runs pause with a checkpoint."""
    deadline = None if stop_after is None else time.monotonic() + stop_after
    from corral.bench.progress import Table
    from corral.storage.replay import available_memory

    if memory is None:
        avail = available_memory("cpu")
        memory = max(0, avail - 2**30) if avail else None
    queue, outcome = _todo(out, runs, retries)
    running: dict[str, tuple[Run, subprocess.Popen]] = {}
    table = Table(out, runs, live=live)

    def halt(why: str) -> None:
        print(f"corral bench: {why}: starting no more runs; the {len(running)} running write a checkpoint after "
              "their current update (a signal kills them at once)", file=sys.stderr, flush=True)
        for _, proc in running.values():
            told.add(proc.pid)
            proc.terminate()

    def stop(signum, frame):
        if outcome.signum is not None:
            raise KeyboardInterrupt  # the second signal: the runs are killed below
        outcome.signum = signum
        if not outcome.timed_out:
            halt(signal.Signals(signum).name)

    told: set[int] = set()
    handlers = _take_signals(stop)
    try:
        while (queue and not outcome.timed_out and outcome.signum is None) or running:
            if deadline is not None and not outcome.timed_out and time.monotonic() >= deadline:
                outcome.timed_out = True
                if outcome.signum is None:
                    halt("the time limit")
            stopping = outcome.timed_out or outcome.signum is not None
            # start what fits: a free slot and the memory for it (one run always starts)
            used = sum(estimated_memory(suite, r) for r, _ in running.values())
            while queue and not stopping and len(running) < jobs:
                need = estimated_memory(suite, queue[0])
                if running and memory is not None and used + need > memory:
                    break
                r = queue.pop(0)
                running[r.name] = (r, _start_runner(run_dir(out, r), suite.threads, allow_code_change))
                used += need
            if stopping:  # a run started as the signal came
                for _, proc in running.values():
                    if proc.pid not in told:
                        told.add(proc.pid)
                        proc.terminate()
            table.update({name: "running" for name in running})
            time.sleep(0.5)
            for name, (r, proc) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[name]
                if _book_exit(outcome, run_dir(out, r), rc, retries):
                    queue.append(r)  # retried after the rest of the queue
                table.update({})
    except KeyboardInterrupt:
        for _, proc in running.values():  # a second signal: no waiting for the runs' checkpoints
            proc.kill()
        raise
    finally:
        for _, proc in running.values():  # an error here: the runs pause with their checkpoints
            if proc.poll() is None:
                proc.terminate()
        for _, proc in running.values():
            proc.wait()
        _restore_signals(handlers)
        table.close()
    return outcome


def _todo(out: Path, runs: list[Run], retries: int) -> tuple[list[Run], Outcome]:
    """The runs to start, and the outcome so far (the runs done, refused or failed before)."""
    queue = [r for r in runs if run_state(run_dir(out, r), retries) == "todo"]
    outcome = Outcome()
    for r in runs:
        state = run_state(run_dir(out, r), retries)
        {"done": outcome.done, "refused": outcome.refused}.get(state, []).append(r.name)
        if state == "failed":
            outcome.failed[r.name] = read_json(run_dir(out, r) / "bench.json", {}).get("error", "")
    return queue, outcome


def _book_exit(outcome: Outcome, d: Path, rc: int, retries: int) -> bool:
    """Book an ended runner in the outcome; whether the run is to be tried again."""
    state = record_exit(d, rc)
    if state in ("done", "refused", "busy", "stopped"):
        getattr(outcome, state).append(d.name)
    elif outcome.signum is not None or outcome.timed_out:
        pass  # ended otherwise while the suite stops (killed before it could pause)
    elif run_state(d, retries) == "todo":
        return True
    else:
        outcome.failed[d.name] = read_json(d / "bench.json", {}).get("error", "")
    return False


def _start_runner(d: Path, threads: int, allow_code_change: bool) -> subprocess.Popen:
    with open(d / "log.txt", "a") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} start\n")
        log.flush()
        # a session of its own: a terminal's Ctrl-C reaches the driver alone, which passes one
        # SIGTERM on (a run that got both would take the second as "abort")
        return subprocess.Popen(runner_command(d, allow_code_change), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=runner_env(threads), preexec_fn=_die_with_parent,
                                start_new_session=True)


def _take_signals(handler) -> dict | None:
    """SIGINT and SIGTERM to ``handler`` (in the main thread only); the previous handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(handlers: dict | None) -> None:
    for s, h in (handlers or {}).items():
        signal.signal(s, h)


def _ray_task(d: str, allow_code_change: bool, threads: int) -> tuple[str, int]:
    """A Ray task: the same runner process, on whichever node Ray placed it."""
    import ray

    path = Path(d)
    env = {**runner_env(threads), "CORRAL_BENCH_NODE": ray.get_runtime_context().get_node_id()}
    with open(path / "log.txt", "a") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} start (ray)\n")
        log.flush()
        rc = subprocess.run(runner_command(path, allow_code_change), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env).returncode
    state = record_exit(path, rc)
    if state == "failed":
        raise RuntimeError(f"{path.name} failed (exit {rc}):\n{log_tail(path)}")
    return path.name, rc


def run_ray(suite: Suite, out: Path, runs: list[Run], *, address: str, retries: int = 2,
            allow_code_change: bool = False, live: bool = True) -> Outcome:
    """Every unfinished run as a Ray task asking for ``suite.threads`` CPUs and its estimated
    memory; Ray places them and retries failures (``max_retries``). ``out`` must be a path
    every node sees (a shared file system)."""
    try:
        import ray
    except ImportError:
        raise UserError("corral bench --ray needs Ray: pip install 'corral[ray]'") from None
    from corral.bench.progress import Table

    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UserError(f"cannot join the Ray cluster at {address!r}: {e}") from None
    outcome = Outcome()
    pending = {}
    for r in runs:
        d = run_dir(out, r)
        state = run_state(d, retries)
        if state == "todo":
            task = ray.remote(_ray_task).options(num_cpus=suite.threads, memory=estimated_memory(suite, r),
                                                 max_retries=retries, retry_exceptions=True, name=r.name)
            pending[task.remote(str(d.resolve()), allow_code_change, suite.threads)] = r
        elif state == "done":
            outcome.done.append(r.name)
        elif state == "refused":
            outcome.refused.append(r.name)
        else:
            outcome.failed[r.name] = read_json(d / "bench.json", {}).get("error", "")
    table = Table(out, runs, live=live)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                r = pending.pop(ref)
                d = run_dir(out, r)
                try:
                    _, rc = ray.get(ref)
                except Exception:  # retries used up: the error is in bench.json
                    outcome.failed[r.name] = read_json(d / "bench.json", {}).get("error", "")
                    continue
                state = run_state(d, retries)
                if state == "done":
                    outcome.done.append(r.name)
                elif state == "refused":
                    outcome.refused.append(r.name)
                elif rc == BUSY:
                    outcome.busy.append(r.name)
                elif rc == STOPPED:
                    outcome.stopped.append(r.name)
            table.update({})
    finally:
        table.close()
    return outcome
