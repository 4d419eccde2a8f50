"""Tournament-based ensemble training (ElegantRL's Podracer, Li et al. 2021), on Ray.

A **leaderboard** keeps the top ``top_k`` agents by evaluation; a **training pool** of Ray
workers trains them. Each job: a worker takes an agent from the leaderboard (picked with
weight by rank) or, with ``fresh_probability`` or while the board is empty, a fresh one;
trains it for a slice of ``slice_steps`` env steps from its exact checkpoint (new random
streams, so two children of one parent differ); evaluates it deterministically; submits it.
The driver waits for whichever job ends first (asynchronous: no worker waits for another),
inserts the agent if it beats the board's last, and hands that worker the next job.

A worker that dies (its process killed, the machine's memory out) is replaced and its job
is run again (``max_restarts``). The leaderboard (``<out>/leaderboard.json``, with the agents'
checkpoints in ``<out>/agents/``) is written after every submission, so an interrupted
tournament continues with ``resume=True``. The board's best evaluation never decreases: an
agent leaves it only for a better one."""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Sequence

from corral.errors import UserError

BOARD = "leaderboard.json"


def train_slice(job: dict) -> dict:
    """One job (in a worker): load or build the agent, train ``slice_steps``, evaluate, save."""
    from corral.agent import config_from_dict
    from corral.rng import RNGStreams
    from corral.train.checkpoint import load_checkpoint
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    parent = job.get("parent_path")
    if parent:
        state = load_checkpoint(parent)
        cfg = config_from_dict(state["config"])
        cfg.steps = int(state["counters"]["env_steps"]) + job["slice_steps"]
    else:
        cfg = build_config(job["algo"], job["env"], seed=job["seed"], sets=list(job["sets"]))
        cfg.steps = job["slice_steps"]
        state = None
    cfg.progress, cfg.tensorboard = False, False
    cfg.eval.every, cfg.eval.episodes = 0, job["eval_episodes"]
    learner = Learner(cfg, None, quiet=True)
    out = {"id": job["id"], "parent": job.get("parent"), "slice": job["slice"]}
    if state is not None:
        learner.load_state_dict(state)
        # a child gets its own random streams: two children of one parent explore differently
        learner.rng.load_state_dict(RNGStreams(job["seed"], learner.device).state_dict())
    else:
        out["start_eval"] = learner.evaluate()["mean_return"]  # the fresh agent, before training
    learner.start()
    try:
        while not learner.done():
            learner.step()
        out["eval"] = learner.evaluate()["mean_return"]
        out["env_steps"] = learner.env_steps
        learner.save(Path(job["path"]))
        out["path"] = job["path"]
    finally:
        learner.cfg.eval.episodes = 0  # no second final evaluation
        learner.close()
    return out


@functools.lru_cache(maxsize=None)
def _worker_cls():
    import ray

    @ray.remote(max_restarts=0)
    class TournamentWorker:
        def __init__(self, imports: Sequence[str] = ()):
            import torch

            from corral.train.setup import import_user_modules

            torch.set_num_threads(1)
            import_user_modules(imports)

        def pid(self) -> int:
            return os.getpid()

        def run(self, job: dict) -> dict:
            return train_slice(job)

    return TournamentWorker


class Leaderboard:
    """The top ``top_k`` agents by evaluation, with the history of its best."""

    def __init__(self, top_k: int, path: Path):
        self.top_k, self.path = top_k, path
        self.entries: list[dict] = []
        self.history: list[dict] = []  # after each submission: {"slice", "best", "submitted"}
        self.submitted = 0
        self.restarts = 0
        self.start_evals: dict[str, float] = {}  # fresh agents' evaluations before any training
        self.next_id = 0

    @property
    def start_eval(self) -> float | None:
        """The evaluation of the tournament's first agent (the lowest id) before training."""
        return self.start_evals[min(self.start_evals)] if self.start_evals else None

    def submit(self, entry: dict) -> bool:
        """Insert ``entry`` if the board has room or it beats the last; True if it is on the board."""
        self.submitted += 1
        if entry.get("start_eval") is not None:
            self.start_evals[entry["id"]] = entry["start_eval"]
        self.entries.append({k: entry[k] for k in ("id", "eval", "path", "env_steps", "parent", "slice")})
        self.entries.sort(key=lambda e: -e["eval"])
        kept = entry["id"] in [e["id"] for e in self.entries[: self.top_k]]
        self.entries = self.entries[: self.top_k]
        self.history.append({"submitted": self.submitted, "best": self.entries[0]["eval"], "eval": entry["eval"],
                             "id": entry["id"], "parent": entry.get("parent"), "kept": kept})
        self.save()
        return kept

    def pick(self, rng: random.Random, fresh_probability: float) -> dict | None:
        """A parent from the board, rank-weighted (the best weighs ``k``, the last 1), or None (fresh)."""
        if not self.entries or rng.random() < fresh_probability:
            return None
        k = len(self.entries)
        return rng.choices(self.entries, weights=[k - i for i in range(k)])[0]

    def save(self) -> None:
        data = {"top_k": self.top_k, "entries": self.entries, "history": self.history, "submitted": self.submitted,
                "restarts": self.restarts, "start_evals": self.start_evals, "next_id": self.next_id}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path, top_k: int) -> "Leaderboard":
        data = json.loads(path.read_text())
        board = cls(top_k, path)
        board.entries = sorted(data["entries"], key=lambda e: -e["eval"])[:top_k]
        board.history, board.submitted = data["history"], data["submitted"]
        board.restarts, board.start_evals, board.next_id = data["restarts"], data["start_evals"], data["next_id"]
        return board


def tournament(algo: str, env: Any = "CartPole-v1", *, workers: int = 2, slices: int = 16, slice_steps: int = 10_000,
               top_k: int = 4, fresh_probability: float = 0.25, eval_episodes: int = 10, seed: int = 0,
               sets: Sequence[str] = (), imports: Sequence[str] = (), out: str | Path = "tournament",
               num_cpus: int | None = None, max_restarts: int = 10, resume: bool = False,
               on_submit: Callable[["Tournament", dict, int], None] | None = None) -> dict:
    """Run a tournament until ``slices`` jobs have been submitted in all (a resumed one counts
    those already done). ``on_submit(tournament, result, worker)`` is called after each
    submission, once ``worker`` (an index in ``tournament.workers``) has its next job (a test
    kills it there). Returns the leaderboard, its best-eval history and the paths."""
    t = Tournament(algo, env, workers=workers, slice_steps=slice_steps, top_k=top_k,
                   fresh_probability=fresh_probability, eval_episodes=eval_episodes, seed=seed, sets=sets,
                   imports=imports, out=out, max_restarts=max_restarts, resume=resume)
    from corral.population.tune import ray_session

    with ray_session(num_cpus):
        return t.run(slices, on_submit)


class Tournament:
    def __init__(self, algo, env, *, workers, slice_steps, top_k, fresh_probability, eval_episodes, seed, sets,
                 imports, out, max_restarts, resume):
        from corral.train.setup import build_config

        if workers < 1 or top_k < 1 or slice_steps < 1:
            raise UserError(f"tournament: workers, top_k and slice_steps must be >= 1 (got {workers}, {top_k}, "
                            f"{slice_steps})")
        if not 0 <= fresh_probability <= 1:
            raise UserError(f"tournament: fresh_probability={fresh_probability} must be in [0, 1]")
        build_config(algo, env, seed=seed, sets=list(sets), imports=list(imports))  # bad input: one error now
        self.algo, self.env, self.sets, self.imports = algo, env, list(sets), list(imports)
        self.n_workers, self.slice_steps = workers, slice_steps
        self.fresh_probability, self.eval_episodes, self.seed = fresh_probability, eval_episodes, seed
        self.max_restarts = max_restarts
        self.out = Path(out).resolve()
        (self.out / "agents").mkdir(parents=True, exist_ok=True)
        path = self.out / BOARD
        if path.exists() and not resume:
            raise UserError(f"{str(path)!r} exists: continue that tournament with resume=True (--resume) or choose "
                            "another output folder")
        self.board = Leaderboard.load(path, top_k) if (resume and path.exists()) else Leaderboard(top_k, path)
        self.rng = random.Random(seed * 1_000_003 + self.board.submitted)
        self.workers: list = []

    def job(self) -> dict:
        parent = self.board.pick(self.rng, self.fresh_probability)
        i = self.board.next_id
        self.board.next_id += 1
        return {"id": f"a{i:04d}", "slice": i, "parent": parent["id"] if parent else None,
                "parent_path": parent["path"] if parent else None, "algo": self.algo, "env": self.env,
                "sets": self.sets, "seed": self.seed * 100_003 + i, "slice_steps": self.slice_steps,
                "eval_episodes": self.eval_episodes, "path": str(self.out / "agents" / f"a{i:04d}.pt")}

    def new_worker(self):
        return _worker_cls().options(num_cpus=0.5).remote(self.imports)

    def run(self, slices: int, on_submit=None) -> dict:
        import ray
        from ray.exceptions import RayActorError, WorkerCrashedError

        self.workers = [self.new_worker() for _ in range(self.n_workers)]
        running: dict = {}  # future -> (worker index, job)
        launched = self.board.submitted

        def launch(w: int, job: dict | None = None) -> None:
            nonlocal launched
            if job is None:
                if launched >= slices:
                    return
                job = self.job()
                launched += 1
            running[self.workers[w].run.remote(job)] = (w, job)

        for w in range(self.n_workers):
            launch(w)
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            fut = done[0]
            w, job = running.pop(fut)
            try:
                result = ray.get(fut)
            except (RayActorError, WorkerCrashedError):
                self.board.restarts += 1
                if self.board.restarts > self.max_restarts:
                    raise RuntimeError(f"tournament: workers died {self.board.restarts} times "
                                       f"(max_restarts={self.max_restarts}); see Ray's logs") from None
                self.workers[w] = self.new_worker()
                launch(w, job)  # the same job again, on the new worker
                continue
            self.board.submit(result)
            launch(w)
            if on_submit is not None:
                on_submit(self, result, w)
        for wk in self.workers:
            ray.kill(wk)
        board = self.board
        return {"leaderboard": board.entries, "best": board.entries[0], "history": board.history,
                "submitted": board.submitted, "restarts": board.restarts, "start_eval": board.start_eval,
                "start_evals": board.start_evals,
                "path": str(board.path)}
