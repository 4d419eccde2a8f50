"""The same collectors, gradient workers and replay server as Ray actors.

``RayScheme(learner).stream()`` is what ``Learner.make_stream()`` runs when
``scheme.collectors`` or ``scheme.grad_workers`` is above 1. What crosses the object
store per update: the collectors' parameters once (``ray.put``, every collector reads
the same object), each fragment once (collector -> learner, or collector -> replay
server for Ape-X, where the learner only sees a small summary), and for gradient
workers the update's batch once plus the parameters and one gradient per minibatch
and worker.

Ray starts here when it is not running yet: joined at ``scheme.ray_address`` (a
cluster; ``auto`` finds the local one), else a local instance sized to the machine.
A Ray this scheme started is shut down at the end; one that was running is left alone.
"""

from __future__ import annotations

import logging
import os

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayError, RayTaskError

from corral.errors import UserError
from corral.schemes.collector import Collector, driver_paths, portable_env_spec
from corral.schemes.fragments import CollectorFailed, FragmentScheme
from corral.schemes.grad import GradientWorker
from corral.schemes.replay_server import SERVERS, ReplayClient

# Ray settings for the local clusters corral starts (not for a cluster it joins). Ray's GCS keeps
# the events of the last 100k tasks for its dashboard (about 500 bytes each); a long run's
# actor calls fill that within its first minutes, and the store only then stops growing.
# corral reads none of it, so keep it small.
LOCAL_RAY_CONFIG = {"task_events_max_num_task_in_gcs": 2000}

START_TIMEOUT_S = 300.0
log = logging.getLogger(__name__)


def _cause(e: BaseException) -> BaseException:
    """What a remote task raised (Ray wraps it), or the Ray error itself for a dead process."""
    if isinstance(e, RayTaskError) and getattr(e, "cause", None) is not None:
        return e.cause
    return e


class RayPool:
    """K collectors as Ray actors; ``collect`` returns two objects, a small summary the
    learner always reads and the data, which only moves to whoever needs it."""

    def __init__(self, cfg, env_spec, num_workers: int, cpus: float, inits: list | None = None,
                 resources: dict | None = None):
        self.cfg, self.env_spec, self.num_workers, self.cpus = cfg, env_spec, num_workers, cpus
        self.resources = resources or None  # custom Ray resources: placed (and restarted) only where offered
        self.remote = ray.remote(Collector)
        self.paths = driver_paths()
        self.generations = [0] * num_workers
        inits = inits or [None] * num_workers
        self.actors = [self._make(k, inits[k]) for k in range(num_workers)]
        self.tasks: dict = {}
        refs = [a.spaces.remote() for a in self.actors]
        try:
            spaces = ray.get(refs, timeout=START_TIMEOUT_S)
        except GetTimeoutError:
            self.close()
            raise UserError(
                f"{num_workers} collectors did not start within {START_TIMEOUT_S:.0f} s; the Ray cluster may "
                f"have fewer free CPUs than they ask for ({cpus:g} each"
                + (f", and {self.resources} of scheme.collector_resources" if self.resources else "")
                + "): lower scheme.collectors or add nodes"
            ) from None
        except RayError as e:
            self.close()
            cause = _cause(e)
            if isinstance(cause, UserError):
                raise cause from None
            raise UserError(f"a collector failed to start: {type(cause).__name__}: {cause}") from None
        self._spaces = spaces[0]
        for k, s in enumerate(spaces):
            if s != self._spaces:
                raise UserError(f"collector {k} built env spaces {s}, collector 0 built {self._spaces}; "
                                "the env must build the same on every worker")

    def _make(self, k: int, init: dict | None = None):
        return self.remote.options(num_cpus=self.cpus, resources=self.resources, max_restarts=0).remote(
            self.cfg, self.env_spec, k, self.num_workers, self.generations[k], self.paths, init)

    def spaces(self):
        return self._spaces

    def submit(self, k: int, params, version: int, env_steps: int, want_state: bool = False) -> None:
        meta, data = self.actors[k].collect.options(num_returns=2).remote(params, version, env_steps, want_state)
        self.tasks[meta] = (k, data)

    def wait(self, timeout: float | None = None) -> list:
        if not self.tasks:
            return []
        ready, _ = ray.wait(list(self.tasks), num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = ray.wait(list(self.tasks), num_returns=len(self.tasks), timeout=0)
        out = []
        for ref in ready:
            k, data = self.tasks.pop(ref)
            try:
                out.append((k, ray.get(ref), data, None))
            except RayError as e:
                out.append((k, None, None, CollectorFailed(_cause(e))))
        return sorted(out, key=lambda r: r[0])

    def get(self, data):
        try:
            return ray.get(data)
        except RayError as e:
            raise CollectorFailed(_cause(e)) from None

    def put(self, state):
        return ray.put(state)

    def restart(self, k: int) -> None:
        for ref, (j, _) in list(self.tasks.items()):
            if j == k:
                del self.tasks[ref]
        try:
            ray.kill(self.actors[k], no_restart=True)
        except (RayError, ValueError):
            pass
        self.generations[k] += 1
        self.actors[k] = self._make(k)

    def close(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except (RayError, ValueError):
                pass
        self.actors = []
        self.tasks.clear()


class RayGradPool:
    """M gradient workers as Ray actors (see ``corral.schemes.grad``).

    A worker whose process dies is replaced in its slot (same index, so the same seeds) and
    its work in flight is redone: the new one loads the update's batch and replays the
    calls of the step in progress (``begin`` and the ``resume`` calls after it; a worker's
    computation is a function of what it is sent), then takes the call that failed. So a
    sync run with a restart equals one without, bit for bit. ``died(index, error)`` (the
    scheme's) counts each death and raises when the part keeps dying."""

    def __init__(self, cfg, num_workers: int, obs_space, act_space, cpus: float, died=None,
                 resources: dict | None = None):
        self.remote = ray.remote(GradientWorker)
        self.args, self.cpus, self.died = (cfg, obs_space, act_space), cpus, died
        self.resources = resources or None
        self.workers = [self._make(i) for i in range(num_workers)]
        self.num_workers = num_workers
        self.pending: dict = {}
        self._batch = None  # the update's batch (object ref) every worker holds
        self._history: list[list] = [[] for _ in range(num_workers)]  # calls of the step in progress

    def _make(self, i: int):
        cfg, obs_space, act_space = self.args
        return self.remote.options(num_cpus=self.cpus, resources=self.resources, max_restarts=0).remote(
            cfg, obs_space, act_space, i)

    def _replace(self, i: int, error: BaseException) -> None:
        """Worker ``i`` died: count it (the scheme may end the run here), start a new one in
        its slot and bring it to where the dead one stood before its last call."""
        if not isinstance(error, RayActorError) or self.died is None:
            raise error
        self.died(i, error)
        try:
            ray.kill(self.workers[i], no_restart=True)
        except (RayError, ValueError):
            pass
        self.workers[i] = w = self._make(i)
        if self._batch is not None:
            w.load.remote(self._batch)
        for method, job in self._history[i][:-1]:
            getattr(w, method).remote(*job)  # in order before the call redone; their results were used

    def load(self, batch: dict) -> None:
        ref = ray.put(batch)  # one object; every worker reads it
        self._batch = ref
        for w in self.workers:
            w.load.remote(ref)  # actor tasks run in submission order: before this update's gradients

    def put(self, x):
        return ray.put(x)

    def gradients(self, params, jobs: list) -> list:
        return self.call("gradient", [(params, *job) for job in jobs])

    def call(self, method: str, jobs: list) -> list:
        """``method(*job)`` on worker i for the i-th job, all results in order; a worker that
        dies meanwhile is replaced and its call redone."""
        refs = []
        for i, job in enumerate(jobs):
            if method in ("gradient", "begin"):  # a new step: what came before is not needed to redo it
                self._history[i] = []
            self._history[i].append((method, job))
            refs.append(getattr(self.workers[i], method).remote(*job))
        out = []
        for i, ref in enumerate(refs):
            while True:
                try:
                    out.append(ray.get(ref))
                    break
                except RayError as e:
                    self._replace(i, e)
                    ref = getattr(self.workers[i], method).remote(*jobs[i])
        return out

    def submit(self, w: int, params, tag, job, method: str = "gradient") -> None:
        self.pending[getattr(self.workers[w], method).remote(params, *job)] = (w, tag, method, params, job)

    def wait(self) -> tuple:
        """The first step to land; one whose worker died is handed to its replacement (async
        steps carry their parameters, so the redone step is the one that was lost)."""
        while True:
            ready, _ = ray.wait(list(self.pending), num_returns=1)
            w, tag, method, params, job = self.pending.pop(ready[0])
            try:
                return w, tag, ray.get(ready[0])
            except RayError as e:
                self._history[w] = []
                self._replace(w, e)
                self.submit(w, params, tag, job, method)

    def close(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except (RayError, ValueError):
                pass
        self.workers = []
        self.pending.clear()


class RayScheme(FragmentScheme):
    def __init__(self, learner):
        super().__init__(learner)
        self._owns_ray = False

    def _actors_needed(self) -> int:
        n = self.K if self.K > 1 else 0
        n += self.sc.grad_workers if self.sc.grad_workers > 1 else 0
        return n + (1 if self.replay_server else 0)

    def _init_ray(self) -> None:
        if ray.is_initialized():
            return
        kw = dict(logging_level=logging.WARNING, log_to_driver=True)
        if self.sc.ray_address:
            try:
                ray.init(address=self.sc.ray_address, **kw)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UserError(f"cannot join the Ray cluster at scheme.ray_address={self.sc.ray_address!r}: {e}; "
                                "check the address (`ray status` on the head node prints it) and, for a cluster "
                                "with token authentication, set RAY_AUTH_MODE=token and the cluster's "
                                "RAY_AUTH_TOKEN") from None
        elif os.environ.get("RAY_ADDRESS"):  # inside `ray job submit` (or set by hand): that cluster
            ray.init(**kw)
        else:
            # Every actor gets a CPU of its own where the machine has them; where it does
            # not, they share (collectors spend much of their time waiting on envs anyway).
            # address="local": a new instance even where `ray start` left a cluster on this
            # machine (Ray would otherwise join that one, and refuse num_cpus).
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, self._actors_needed()),
                     include_dashboard=False, _system_config=LOCAL_RAY_CONFIG, **kw)
        self._owns_ray = True

    def _cpus_per_actor(self) -> float:
        total = float(ray.cluster_resources().get("CPU", 1.0))
        return min(1.0, total / max(1, self._actors_needed()))

    def _resources(self, part: str) -> dict | None:
        """``scheme.<part>_resources``, checked: custom resource names to amounts, asked by
        every actor of that part at its start and at each restart, so a node that goes away
        is replaced only by nodes that offer them."""
        key = f"{part}_resources"
        res = getattr(self.sc, key)
        if not res:
            return None
        bad = [f"{k}: {v!r}" for k, v in res.items() if not isinstance(k, str) or k in ("CPU", "GPU", "memory")
               or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0]
        if bad:
            raise UserError(f"scheme.{key} has {', '.join(bad)}; give custom resource names (not CPU/GPU/memory, "
                            f"which the scheme sets) with positive amounts, e.g. {{{part}_slot: 1}}")
        total = ray.cluster_resources()
        missing = [k for k in res if total.get(k, 0.0) < res[k]]
        if missing:
            raise UserError(f"scheme.{key} asks for {res}, but no node of the Ray cluster offers "
                            f"{', '.join(missing)} (it has {sorted(k for k in total if ':' not in k)}); start nodes "
                            f"with `ray start --resources='{{\"{missing[0]}\": N}}'` or change scheme.{key}")
        return {k: float(v) for k, v in res.items()}

    def start(self) -> None:
        self._init_ray()
        self._placement = {part: self._resources(part) for part in ("collector", "grad", "replay")}
        self._cpus = self._cpus_per_actor()
        super().start()

    def make_pool(self, inits):
        return RayPool(self.learner.cfg, portable_env_spec(self.learner.env_spec), self.K, self._cpus, inits,
                       self._placement["collector"])

    def make_grad_pool(self, algo):
        return RayGradPool(self.learner.cfg, self.sc.grad_workers, algo.obs_space, algo.act_space, self._cpus,
                           died=lambda i, e: self.part_died(f"gradient worker {i}", "grad", _cause(e)),
                           resources=self._placement["grad"])

    def _replay_actor(self):
        algo = self.learner.algo
        remote = ray.remote(SERVERS[algo.replay_items]).options(num_cpus=self._cpus, max_restarts=0,
                                                                resources=self._placement["replay"])
        self.replay_actor = remote.remote(algo.cfg, algo.num_envs, algo.obs_space, algo.act_space,
                                          self.learner.rng.seeds["replay"])
        actor = self.replay_actor
        return lambda name, *args: getattr(actor, name).remote(*args)

    def make_replay(self, local):
        algo = self.learner.algo
        client = ReplayClient(self._replay_actor(), ray.get, self.learner.device, local.capacity,
                              algo.cfg.prefetch, SERVERS[algo.replay_items])  # a replay-server algorithm declares prefetch
        try:  # the server sizes its buffer where it is placed: a refusal is the run's, before it starts
            ray.get(self.replay_actor.size.remote(), timeout=START_TIMEOUT_S)
        except (RayError, GetTimeoutError) as e:
            cause = _cause(e)
            text = str(cause).strip().splitlines()
            raise UserError(f"the replay server did not start: {type(cause).__name__}: "
                            f"{next((ln for ln in reversed(text) if 'Error' in ln), text[-1] if text else '')}") from None
        client.revive = lambda e: self._revive_replay(client, e)
        client.done = lambda handles: ray.wait(handles, num_returns=len(handles), timeout=0, fetch_local=False)[0]
        client.lost = lambda e: isinstance(e, ObjectLostError)
        client.on_drop = self._fragment_lost
        return client

    def _fragment_lost(self, n: int) -> None:
        """A fragment's data was lost before the server read it (the node that held it went
        away with its collector): its transitions count as lost, like a server's."""
        self.replay_lost += n
        log.warning("corral: a fragment of %d transitions was lost on its way to the replay server "
                    "(the node holding it went away)", n)

    def _revive_replay(self, client: ReplayClient, error: BaseException) -> None:
        """The replay server died: a new one from the learner's last checkpoint (``latest.pt``
        holds the replay when the run saves it), the transitions sent since then counted as
        lost; a server that raised (not died) ends the run with its error."""
        if not isinstance(error, RayActorError):
            raise error
        self.part_died("the replay server", "replay", _cause(error))
        try:
            ray.kill(self.replay_actor, no_restart=True)
        except (RayError, ValueError):
            pass
        state = self.replay_snapshot()
        lost = client.replace(self._replay_actor(), state)
        self.replay_lost += lost
        log.warning("corral: the replay server died (%s); restarted from %s, %d transitions lost",
                    _cause(error), "the last checkpoint" if state is not None else "empty", lost)

    def close(self, failing: bool = False) -> None:
        try:
            super().close(failing)
        finally:
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False
