"""The distributed stream, independent of where collectors run.

``FragmentScheme`` turns fragments from K collectors into the same stream of update
events that ``Learner.stream()`` yields, keeping the learner's counters. A *pool* runs
the collectors: ``LocalPool`` in this process (tests, debugging), ``RayPool`` in Ray
actors (``corral.schemes.ray_scheme``). Three loops:

* ``sync``: broadcast, every collector collects one fragment with that version, the
  learner replays all K in collector order through ``Algorithm.observe`` (updates run
  whenever ``ready()``), then broadcasts the new version. On-policy exactly.
* ``async``: each fragment is replayed as soon as it arrives and its collector is sent
  off again with the newest parameters; ``policy_lag`` records how old they were.
* replay servers (Ape-X): collectors' fragments go straight to a replay actor; the
  learner samples from it, returns priorities and broadcasts, at the algorithm's own
  replay ratio (``train_freq`` / ``gradient_steps`` per env step, as in-process).

A collector that fails (its process dies, its env raises) is rebuilt with a new seed
and sent the current parameters; its fragment in flight is dropped and counted.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from corral.errors import TrainingError, UserError
from corral.kernels.precision import update_matmul
from corral.schemes.collector import (
    Collector,
    FragmentData,
    FragmentMeta,
    collector_state,
    driver_paths,
    merge_deltas,
    portable_env_spec,
    state_nbytes,
)


class CollectorFailed(Exception):
    """A collector task failed; ``cause`` is what it raised (or why its process died)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class LocalPool:
    """Collectors in this process, run one at a time when waited on. Same interface as
    ``RayPool``: ``submit``, ``wait``, ``get``, ``restart``, ``put``, ``close``."""

    def __init__(self, cfg, env_spec, num_workers: int, inits: list | None = None):
        self.cfg, self.env_spec, self.num_workers = cfg, env_spec, num_workers
        self.generations = [0] * num_workers
        inits = inits or [None] * num_workers
        self.collectors = [self._make(k, inits[k]) for k in range(num_workers)]
        self.pending: list[tuple[int, tuple]] = []

    def _make(self, k: int, init: dict | None = None) -> Collector:
        return Collector(self.cfg, self.env_spec, k, self.num_workers, self.generations[k], driver_paths(), init)

    def spaces(self):
        return self.collectors[0].spaces()

    def submit(self, k: int, params: Any, version: int, env_steps: int, want_state: bool = False) -> None:
        self.pending.append((k, (params, version, env_steps, want_state)))

    def wait(self, timeout: float | None = None) -> list:
        if not self.pending:
            return []
        k, args = self.pending.pop(0)
        try:
            meta, data = self.collectors[k].collect(*args)
        except Exception as e:  # noqa: BLE001 - any failure of a collector is restartable
            return [(k, None, None, CollectorFailed(e))]
        return [(k, meta, data, None)]

    def get(self, data: FragmentData) -> FragmentData:
        return data

    def put(self, state: dict) -> dict:
        return state

    def restart(self, k: int) -> None:
        self.collectors[k].close()
        self.generations[k] += 1
        self.collectors[k] = self._make(k)

    def in_flight(self) -> int:
        return len(self.pending)

    def close(self) -> None:
        for c in self.collectors:
            c.close()


class FragmentScheme:
    """The distributed stream over a pool of collectors (see the module docstring)."""

    def __init__(self, learner):
        self.learner = learner
        sc = learner.cfg.scheme
        self.sc = sc
        self.K = sc.collectors
        self.T = learner.algo.fragment_length()
        self.replay_server = learner.algo.replay_server and self.K > 1
        # per collector: the algorithm's column state (PPO's discounted return) for its episodes
        self._columns: dict[int, dict] = {}
        self.collector_states: list | None = None  # per collector: resume state (``resume_states``)
        self.version = 0
        self._params = None
        self._params_version = -1
        self.param_bytes = 0
        self.restarts = 0  # collectors'
        self.dropped = 0
        self.replay_restarts = 0
        self.replay_lost_updates = 0  # updates given up: the server died in them, its replacement under a batch
        self.replay_lost = 0  # transitions the replay server held or was sent, lost with it
        self.grad_restarts = 0
        self.fragments = 0
        self._lags: list[int] = []
        self._wait = 0.0
        self._sps: dict[int, float] = {}
        # per collector since the last metrics: episode returns, fragments consumed (TensorBoard's actor/<k>/...)
        self._actor_returns: dict[int, list[float]] = {}
        self._actor_fragments: dict[int, int] = {}
        self.pool = None
        self.grad_pool = None
        self.fragment_callback = None  # tests: called with (meta, data) of every consumed fragment

    # --- set-up -----------------------------------------------------------------------------
    def make_pool(self, inits: list):
        return LocalPool(self.learner.cfg, portable_env_spec(self.learner.env_spec), self.K, inits)

    def make_grad_pool(self, algo):
        from corral.schemes.grad import LocalGradPool

        return LocalGradPool(self.learner.cfg, self.sc.grad_workers, algo.obs_space, algo.act_space)

    def _rebuild_algo(self, cls=None, **cfg_changes):
        """The learner's algorithm with another class or config, carrying its state over."""
        L = self.learner
        old = L.algo
        cfg = dataclasses.replace(old.cfg, **cfg_changes) if cfg_changes else old.cfg
        new = (cls or type(old))(cfg, old.obs_space, old.act_space, old.env_columns, old.device, L.rng, old.role)
        new.total_steps = old.total_steps
        new.load_state_dict(old.state_dict())
        L.algo = new
        return new

    def setup_learner(self) -> None:
        """Shape the learner's algorithm for fragments: a rollout algorithm holds K
        fragments per update (each collector's ``n_steps`` x ``num_envs``, so a batch is K
        times the in-process one); gradient workers take over its minibatch gradients."""
        L = self.learner
        algo = L.algo
        cls = None
        if self.sc.grad_workers > 1:
            from corral.schemes.grad import sharded_class

            cls = sharded_class(algo)
        changes = algo.scheme_config(self.K)
        if cls is not None or changes:
            algo = self._rebuild_algo(cls, **changes)
        if self.sc.grad_workers > 1:
            self.grad_pool = self.make_grad_pool(algo)
            algo.attach(self.grad_pool, self.sc.grad)

    def start(self) -> None:
        self.learner.scheme = self  # its checkpoints ask this scheme for the collectors' states
        self.setup_learner()
        if self.K > 1:
            L = self.learner
            inits: list = [None] * self.K
            saved = L.saved_scheme_state
            if saved is not None and len(saved) == self.K:
                # a distributed checkpoint with as many collectors: each continues its own episodes
                inits = [s or None for s in saved]
                self._columns = {k: s["columns"] for k, s in enumerate(saved) if s and s.get("columns")}
            elif getattr(L.env, "copyable", False):
                # Collector 0 continues the learner's own episodes (a run resumed from an
                # in-process checkpoint picks up where it stopped).
                inits[0] = {"env": L.env.state_dict(), "obs": L.obs.cpu(),
                            "column": {k: v.cpu() for k, v in L.algo.column_state().items()}}
            L.saved_scheme_state = None
            self.collector_states = [None] * self.K
            self.pool = self.make_pool(inits)
            obs_space, act_space = self.pool.spaces()
            if obs_space != L.algo.obs_space or act_space != L.algo.act_space:
                raise UserError(
                    f"env {L.cfg.env.id!r} built in a collector has spaces {obs_space} / {act_space}, but the "
                    f"learner's has {L.algo.obs_space} / {L.algo.act_space}; the env must build the same "
                    "everywhere (seeded or fixed spaces)"
                )
            if self.replay_server:
                self.start_replay()

    def start_replay(self) -> None:
        """Move the learner's replay into a server; what it held (a resumed run) goes along."""
        algo = self.learner.algo
        local = algo.replay
        server = self.make_replay(local)
        if len(local):
            state = local.state_dict()
            if getattr(local, "server_state", None) is not None:  # a mid-run checkpoint's server state
                state["server"], local.server_state = local.server_state, None
            server.load_state_dict(state)
            server.size = len(local)
        self._local_replay = local
        algo.replay = server

    def make_replay(self, local):
        from corral.schemes.replay_server import SERVERS, LocalReplay

        algo = self.learner.algo
        cls = SERVERS[algo.replay_items]
        server = cls(algo.cfg, algo.num_envs, algo.obs_space, algo.act_space, self.learner.rng.seeds["replay"])
        return LocalReplay(server, self.learner.device, local.capacity)

    def stop_replay(self) -> None:
        """Bring the replay back into the learner's algorithm, so the final checkpoint and
        anything after the run see every transition."""
        local = getattr(self, "_local_replay", None)
        if local is None:
            return
        algo = self.learner.algo
        try:
            local.load_state_dict(algo.replay.state_dict())
            local.server_state = None  # what the server had drawn ahead is not trained on after the run
        finally:
            algo.replay = local
            self._local_replay = None

    def close(self, failing: bool = False) -> None:
        failing = failing or bool(getattr(self.learner, "failed", False))  # e.g. a hook's save found a part gone
        try:
            self.stop_replay()
        except Exception:  # noqa: BLE001 - a dead server while the run is failing anyway: keep its error
            if not failing:
                raise
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.grad_pool is not None:
            self.grad_pool.close()
            self.grad_pool = None

    # --- the stream -------------------------------------------------------------------------
    def stream(self):
        failing = False
        try:
            self.start()
            if self.K == 1:
                yield from self._with_metrics_stream(self.learner.stream())
            elif self.replay_server:
                yield from self._replay_server_loop()
            elif self.sc.collect == "sync":
                yield from self._sync_loop()
            else:
                yield from self._async_loop()
        except GeneratorExit:  # the consumer stopped early (stop_at_return): a normal end
            raise
        except BaseException:
            failing = True
            raise
        finally:
            self.close(failing)

    def _with_metrics_stream(self, inner):
        for stats in inner:
            self.version += 1
            yield self.metrics(stats)

    def params(self):
        """The object-store handle of the current parameters: put once per version."""
        if self._params_version != self.version:
            state = collector_state(self.learner.algo)
            self.param_bytes = state_nbytes(state)
            self._params = self.pool.put(state)
            self._params_version = self.version
        return self._params

    def submit(self, k: int) -> None:
        # collectors send their env and RNG state along when the run writes checkpoints
        self.pool.submit(k, self.params(), self.version, self.learner.env_steps, self.learner.run_dir is not None)

    def wait(self, timeout: float | None = None) -> list:
        t0 = time.perf_counter()
        out = self.pool.wait(timeout)
        self._wait += time.perf_counter() - t0
        return out

    def failed(self, k: int, err: CollectorFailed) -> None:
        """Drop the fragment in flight, rebuild the collector, or give up after max_restarts."""
        cause = err.cause
        if isinstance(cause, UserError):
            raise cause
        self._columns.pop(k, None)  # the restarted collector starts fresh episodes
        self.dropped += 1
        self.restarts += 1
        if self.restarts > self.sc.max_restarts:
            raise TrainingError(
                f"collector {k} failed and collectors have been restarted {self.restarts - 1} times "
                f"(scheme.max_restarts={self.sc.max_restarts}); last failure: {type(cause).__name__}: "
                f"{str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
            ) from None
        self.pool.restart(k)

    LIMITS = {"replay": "max_replay_restarts", "grad": "max_grad_restarts"}

    def part_died(self, name: str, part: str, cause: BaseException) -> None:
        """Count a death of the replay server (``part="replay"``) or a gradient worker
        (``"grad"``); past the part's ``scheme.max_*_restarts`` the run ends (its last
        checkpoint stays) with one message naming the part and its last error."""
        if part == "replay":
            self.replay_restarts = count = self.replay_restarts + 1
        else:
            self.grad_restarts = count = self.grad_restarts + 1
        limit = self.LIMITS[part]
        if count > getattr(self.sc, limit):
            last = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            raise TrainingError(
                f"{name} died and {'gradient workers have' if part == 'grad' else 'it has'} been restarted "
                f"{count - 1} times (scheme.{limit}={getattr(self.sc, limit)}); the run ends with its last "
                f"checkpoint; last error: {type(cause).__name__}: {last}") from None

    def replay_snapshot(self) -> dict | None:
        """The replay state of the learner's last checkpoint (``latest.pt``), or None."""
        L = self.learner
        path = L.run_dir / "checkpoints" / "latest.pt" if L.run_dir is not None else None
        if path is None or not path.is_file():
            return None
        from corral.train.checkpoint import load_checkpoint

        state = load_checkpoint(path)
        if int(state["counters"]["env_steps"]) > L.env_steps:  # not this run's (cannot be ahead of it)
            return None
        return state["algo"].get("replay")

    def metrics(self, stats: dict) -> dict:
        out = dict(stats)
        if self.replay_server:
            out["replay_restarts"] = float(self.replay_restarts)
            out["replay_lost_transitions"] = float(self.replay_lost)
            out["replay_lost_updates"] = float(self.replay_lost_updates)
        if self.sc.grad_workers > 1:
            out["grad_worker_restarts"] = float(self.grad_restarts)
        if self.K > 1:
            if self._lags:
                out["policy_lag"] = sum(self._lags) / len(self._lags)
                out["policy_lag_max"] = float(max(self._lags))
            out["fragments"] = float(self.fragments)
            out["collector_restarts"] = float(self.restarts)
            out["dropped_fragments"] = float(self.dropped)
            out["learner_wait_seconds"] = self._wait
            out["param_bytes"] = float(self.param_bytes)
            for k, sps in sorted(self._sps.items()):
                out[f"collector{k}_sps"] = sps
            for k, n in sorted(self._actor_fragments.items()):
                out[f"collector{k}_fragments"] = float(n)
            for k, rets in sorted(self._actor_returns.items()):
                if rets:
                    out[f"collector{k}_episode_return"] = sum(rets) / len(rets)
                    out[f"collector{k}_episodes"] = float(len(rets))
            self._actor_returns.clear()
            self._actor_fragments.clear()
        self._lags.clear()
        self._wait = 0.0
        return out

    def resume_states(self) -> list | None:
        """Where each collector stands after its last consumed fragment (env state, obs, RNG,
        column state), for the checkpoint; None when no collector's env can be copied."""
        if self.collector_states is None or not any(self.collector_states):
            return None
        return [s or {} for s in self.collector_states]

    def note_fragment(self, meta: FragmentMeta, version_now: int) -> None:
        """Book a consumed fragment: lag, speed, and where its collector now stands (what a
        checkpoint keeps, so a resume continues each collector's episodes)."""
        states = self.collector_states
        if states is not None and meta.worker < len(states):
            states[meta.worker] = meta.resume
            if meta.resume is not None and meta.worker in self._columns:
                states[meta.worker] = {**meta.resume, "columns": self._columns[meta.worker]}
        self.fragments += 1
        self._lags.append(version_now - meta.version)
        self._sps[meta.worker] = meta.steps / max(meta.seconds, 1e-9)
        self._actor_fragments[meta.worker] = self._actor_fragments.get(meta.worker, 0) + 1

    def consume(self, meta: FragmentMeta, data: FragmentData) -> list[dict]:
        """Replay one fragment through the learner's algorithm, as the in-process loop would.
        The columns carry this collector's episodes, so its column state is swapped in."""
        L = self.learner
        algo = L.algo
        merge_deltas(algo.actor, meta.norm_deltas)
        if self.fragment_callback is not None:
            self.fragment_callback(meta, data)
        data = data.to(L.device)
        columns = algo.column_state()
        if columns:
            k = meta.worker
            # collector 0's first fragment continues the learner's own episodes; others start fresh
            algo.load_column_state(self._columns.get(k) or
                                   (columns if k == 0 else {name: torch.zeros_like(v) for name, v in columns.items()}))
        total = L.cfg.steps
        n = data.reward.shape[1]
        updates = []
        fed = 0
        no_grad = torch.no_grad()
        for step in data.steps():
            if L.env_steps >= total:
                break
            with no_grad:
                algo.observe(step)
            L.add_steps(n)
            fed += 1
            if algo.ready():
                with update_matmul(L.cfg.matmul):
                    updates.append(algo.update(min(1.0, L.env_steps / total)))
                self.version += 1
        if columns:
            self._columns[meta.worker] = algo.column_state()
        self.note_fragment(meta, self.version - len(updates))
        self.count_episodes(meta, fed)
        return updates

    def count_episodes(self, meta: FragmentMeta, fed: int) -> None:
        """The episodes that ended in the first ``fed`` steps of a fragment."""
        returns = [r for t, r, _ in meta.episodes if t < fed]
        self.learner.add_episodes(returns, [n for t, _, n in meta.episodes if t < fed])
        self._actor_returns.setdefault(meta.worker, []).extend(returns)
        if self.learner.episode_log is not None and returns:
            self.learner.episode_log(f"c{meta.worker}", returns, [n for t, _, n in meta.episodes if t < fed])

    def _fragment(self, k, meta, data):
        """The fragment's data here, or None when fetching it shows the collector failed."""
        try:
            return self.pool.get(data)
        except Exception as e:  # noqa: BLE001
            self.failed(k, CollectorFailed(e))
            return None

    def _sync_loop(self):
        L, K = self.learner, self.K
        total = L.cfg.steps
        while L.env_steps < total:
            for k in range(K):
                self.submit(k)
            results: dict[int, tuple] = {}
            while len(results) < K:
                for k, meta, data, err in self.wait():
                    if err is None:
                        data = self._fragment(k, meta, data)
                    if err is not None or data is None:
                        if err is not None:
                            self.failed(k, err)
                        self.submit(k)  # same version: the round stays on-policy
                        continue
                    results[k] = (meta, data)
            updates = []
            for k in range(K):
                updates += self.consume(*results[k])
            for stats in updates:
                yield self.metrics(stats)

    def _async_loop(self):
        L, K = self.learner, self.K
        total = L.cfg.steps
        per_fragment = self.T * L.cfg.env.num_envs
        busy: set[int] = set()

        def dispatch(k):
            if L.env_steps + len(busy) * per_fragment < total:
                self.submit(k)
                busy.add(k)

        for k in range(K):
            dispatch(k)
        held: list = []
        first = True  # collector 0's first fragment goes first: it continues the learner's episodes
        while busy and L.env_steps < total:
            arrived = held + self.wait()
            held = []
            for k, meta, data, err in arrived:
                if first and err is None and k != 0 and 0 in busy:
                    held.append((k, meta, data, err))
                    continue
                busy.discard(k)
                if err is None:
                    data = self._fragment(k, meta, data)
                if err is not None or data is None:
                    if err is not None:
                        self.failed(k, err)
                    dispatch(k)
                    continue
                first = False
                updates = self.consume(meta, data)
                dispatch(k)
                for stats in updates:
                    yield self.metrics(stats)

    def _replay_server_loop(self):
        """Ape-X: fragments go to the replay server; the learner trains at the in-process
        replay ratio (``gradient_steps`` every ``train_freq`` vector steps, counted over all
        collectors) and never waits on collectors while it owes updates."""
        L, K = self.learner, self.K
        algo = L.algo
        cfg = algo.cfg
        total = L.cfg.steps
        n = L.cfg.env.num_envs
        per_fragment = self.T * n
        backlog = max(1, K * self.T // max(1, cfg.train_freq))  # updates owed before collectors pause
        first = -(-cfg.learning_starts // n)  # the first vector step an in-process run may update at

        def updates_by(vector_steps: int) -> int:
            """Updates an in-process run has made after ``vector_steps``: one at every multiple
            of train_freq from the first vector step with learning_starts env steps."""
            return max(0, vector_steps // cfg.train_freq - (first - 1) // cfg.train_freq)

        done = updates_by(algo.vector_steps)  # a resumed run made these already
        busy: set[int] = set()
        idle: set[int] = set(range(K))

        def due() -> int:
            nonlocal done
            if not algo.replay.can_sample(cfg.batch_size):
                # none owed while there is nothing to draw (as in-process, where an update needs
                # a batch; after a server restarted empty, the updates missed are not made up)
                done = updates_by(algo.vector_steps)
                return 0
            return updates_by(algo.vector_steps) - done

        while L.env_steps < total:
            for k in sorted(idle):
                if due() <= backlog and L.env_steps + len(busy) * per_fragment < total:
                    self.submit(k)
                    busy.add(k)
                    idle.discard(k)
            arrived = self.wait(timeout=None if due() <= 0 else 0)
            for k, meta, data, err in arrived:
                busy.discard(k)
                idle.add(k)
                if err is not None:
                    self.failed(k, err)
                    continue
                # the whole fragment, or as much as the step budget has room for
                rows = min(self.T, -(-(total - L.env_steps) // n))
                if rows <= 0:
                    continue
                algo.replay.add(data, rows, n, (meta.worker, meta.generation))
                self.note_fragment(meta, self.version)
                if self.fragment_callback is not None:
                    self.fragment_callback(meta, data)
                merge_deltas(algo.actor, meta.norm_deltas)
                self.count_episodes(meta, rows)
                L.add_steps(rows * n)
                algo.advance(rows * n)
            if due() > 0:
                done += 1
                stats = self._replay_update(algo, min(1.0, L.env_steps / total))
                if stats is not None:
                    self.version += 1
                    yield self.metrics(stats)
        while due() > 0:  # the updates the last fragments paid for
            done += 1
            stats = self._replay_update(algo, 1.0)
            if stats is not None:
                self.version += 1
                yield self.metrics(stats)

    def _replay_update(self, algo, progress: float) -> dict | None:
        """One update against the replay server, or None when the server died during it and
        its replacement holds less than a batch: the update is given up (counted in
        ``replay_lost_updates``; its gradient steps already taken stay) and training goes on
        once the collectors have refilled the server."""
        from corral.schemes.replay_server import ReplayRestarted

        try:
            with update_matmul(self.learner.cfg.matmul):
                return algo.update(progress)
        except ReplayRestarted:
            self.replay_lost_updates += 1
            return None
