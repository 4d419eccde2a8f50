"""Ape-X DQN on CartPole on Ray with (or without) random kills: the chaos run of issue 19.

Every ``--kill-every`` seconds one part picked at random (a collector, a gradient worker or
the replay server) is killed with ``ray.kill`` (tests/conftest.py ``ray_scheme_killing``);
``--kill-every 0`` is the undisturbed run. Every ``--sample-every`` seconds it records the
resident memory of the learner and of every process of its Ray session (the learner's
descendants: raylet, GCS, workers) and the object store's use (Ray's memory summary).
Each process's resident memory is split into the object store's pages it has mapped
(shared: every process that reads an object maps the store's file and its resident size
counts the pages it touched, so a collector that reads each new parameter version where the
store happened to place it "grows" until it has touched the store's whole footprint) and
the rest, its own (``own``: heap, stacks, libraries); ``store_footprint_mb`` is the memory
the store's file really holds (its allocated pages, counted once).
Writes one JSON with the periodic evaluations, the held-out evaluation (20 episodes,
seed 123), the kills, the restarts and the memory samples.

    python benchmarks/chaos_apex.py --seed 0 --steps 60000 --kill-every 60 --run-dir runs/chaos --out chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def is_store_file(path: str) -> bool:
    """Ray's shared-memory object store: a file ``plasma*`` (in /dev/shm, or /tmp where that
    is too small), unlinked once mapped."""
    return os.path.basename(path.replace(" (deleted)", "")).startswith("plasma")


def process_memory(p) -> tuple[int, int]:
    """``(rss, store)`` bytes of a ``psutil.Process``: its resident memory and the part of it
    that is pages of the object store's file (shared with every process that maps them)."""
    store = 0
    try:
        store = sum(m.rss for m in p.memory_maps(grouped=True) if is_store_file(m.path))
    except (AttributeError, NotImplementedError):  # no per-mapping figures on this platform
        pass
    return p.memory_info().rss, store


def store_footprint(pids) -> int | None:
    """Bytes the object store's file holds (allocated pages, each counted once), from the
    first of ``pids`` with it open (the raylet), or None."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if is_store_file(os.readlink(f"/proc/{pid}/fd/{fd}")):
                    return os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
            except OSError:
                pass
    return None


def memory_sample(t0: float) -> dict:
    import psutil
    import ray

    me = psutil.Process(os.getpid())
    procs = {}
    for p in [me] + me.children(recursive=True):
        try:
            cmd = p.cmdline()
            # an actor's title (ray::Collector), else the program and its first argument that is
            # not an option, without directories (gcs_server, raylet, python log_monitor.py)
            plain = [os.path.basename(a) for a in cmd[1:] if not a.startswith("-")][:1]
            name = (cmd[0] if cmd and cmd[0].startswith("ray::") else
                    " ".join([os.path.basename(cmd[0])] + plain) if cmd else "")[:60] or p.name()
            procs[p.pid] = (name, *process_memory(p))
        except psutil.Error:
            pass
    store = None
    if ray.is_initialized():
        try:
            from ray._private.internal_api import memory_summary

            # this run's cluster (without an address Ray picks the newest one on the machine)
            text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
            m = re.search(r"Plasma memory usage (\d+(?:\.\d+)?) MiB", text)
            store = float(m.group(1)) if m else None
        except Exception:  # noqa: BLE001 - a sample missed during a restart
            pass
    mb = lambda b: round(b / 2**20, 1)  # noqa: E731
    workers = [(n, r, s, pid) for pid, (n, r, s) in procs.items() if pid != me.pid]
    footprint = store_footprint(list(procs))
    return {"t": round(time.time() - t0, 1), "learner_mb": mb(procs[me.pid][1]),
            "learner_own_mb": mb(procs[me.pid][1] - procs[me.pid][2]),
            "ray_processes_mb": mb(sum(w[1] for w in workers)),
            "ray_processes_own_mb": mb(sum(w[1] - w[2] for w in workers)), "ray_processes": len(workers),
            "object_store_mb": store,  # Ray's count of the objects it holds
            "store_footprint_mb": None if footprint is None else mb(footprint),  # the memory its file holds
            # each process by its title (Ray names an actor's process ray::<Class>): which one grows;
            # [name, rss, own (rss less the object store's pages it maps), pid]
            "per_process_mb": sorted(((n, mb(r), mb(r - s), pid) for n, r, s, pid in workers), key=lambda x: -x[1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60_000)
    ap.add_argument("--kill-every", type=float, default=60.0)
    ap.add_argument("--sample-every", type=float, default=30.0)
    ap.add_argument("--grad-workers", type=int, default=2, help="1: no gradient workers to kill (faster)")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop training after this many minutes of wall time (0: no limit; the output says if it did)")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from conftest import ray_scheme_killing

    import corral
    from corral.schemes.ray_scheme import RayScheme
    from corral.train.learner import Learner
    from corral.train.setup import build_config, new_run_dir

    over = {"scheme.collectors": 2, "scheme.grad_workers": a.grad_workers, "checkpoint.every": 5000, "eval.every": 5000,
            "eval.episodes": 10, "tensorboard": False, "progress": False}
    cfg = build_config("apex_dqn", "CartPole-v1", steps=a.steps, seed=a.seed, overrides=over)
    cfg.scheme.max_restarts = cfg.scheme.max_replay_restarts = cfg.scheme.max_grad_restarts = 1000
    L = Learner(cfg, new_run_dir(cfg, a.run_dir), quiet=True)
    import ray

    ray.init(address="local", num_cpus=3 + (a.grad_workers if a.grad_workers > 1 else 0), include_dashboard=False, logging_level="WARNING")  # as the scheme would size it
    if a.kill_every > 0:
        scheme, killed = ray_scheme_killing(L, ray, "chaos", after=a.kill_every, times=10**6, index=a.seed)
    else:
        scheme, killed = RayScheme(L), []
        L.make_stream = scheme.stream
    t0 = time.time()
    samples, done = [], threading.Event()

    def sample():  # written as it goes, so a run stopped early still leaves its curve
        while not done.wait(a.sample_every):
            samples.append(memory_sample(t0))
            Path(a.out + ".partial").write_text(json.dumps({"kills": killed, "memory": samples}))

    threading.Thread(target=sample, daemon=True).start()
    class WallLimit:  # a hook: stop at the next update past the limit (the final eval and checkpoint still run)
        hit = False

        def __call__(self, learner, stats):
            if a.max_minutes > 0 and time.time() - t0 > 60 * a.max_minutes:
                learner.stop = WallLimit.hit = True

        def close(self, learner):
            pass

    summary = L.train(hooks=[WallLimit()])
    done.set()
    wall = time.time() - t0
    rows = [json.loads(line) for line in (Path(L.run_dir) / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_return"]) for r in rows if "eval_return" in r]
    held = corral.evaluate(corral.load(L.run_dir), "CartPole-v1", episodes=20, seed=123)["mean_return"]  # best.pt
    held_latest = corral.evaluate(corral.load(Path(L.run_dir) / "checkpoints" / "latest.pt"), "CartPole-v1",
                                  episodes=20, seed=123)["mean_return"]  # the policy it ended with
    out = {"seed": a.seed, "steps": summary["env_steps"], "kill_every_s": a.kill_every, "wall_s": round(wall, 1),
           "stopped_at_wall_limit": WallLimit.hit, "kills": killed, "restarts": {"collector": scheme.restarts, "grad": scheme.grad_restarts,
                                         "replay": scheme.replay_restarts},
           "replay_lost_transitions": scheme.replay_lost, "held_out": held, "held_out_latest": held_latest,
           "learner_cpu_s": round(time.process_time(), 1), "evals": evals, "memory": samples,
           "loadavg_end": os.getloadavg()}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in ("memory", "evals")}))
    ray.shutdown()


if __name__ == "__main__":
    main()
