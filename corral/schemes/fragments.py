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

import torch

from corral.errors import TrainingError, UserError
from corral.kernels.compiled import update_mode
from corral.schemes.collector import (
    FragmentData,
    FragmentMeta,
    collector_state,
    merge_deltas,
    portable_env_spec,
    state_nbytes,
)
from corral.schemes.pool import CollectorFailed, LocalPool
from corral.schemes.replay_loop import ReplayServerParts


class FragmentScheme(ReplayServerParts):
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
                with update_mode(L.cfg):
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
