"""Gradient workers: M processes compute gradients on shards of each minibatch.

``grad=sync``: every minibatch is split into M shards; each worker computes the mean loss
of its shard and its gradient with the learner's current parameters; the learner averages
the gradients weighted by shard size, which is the gradient of the whole minibatch's mean
loss, then clips and steps as in-process. Everything that couples the samples of a
minibatch (advantage normalization) is computed by the learner on the whole minibatch and
sent along, so the result equals the single-process gradient up to float rounding
(``tests/test_schemes.py`` checks it).

``grad=async``: each worker takes a whole minibatch with the parameters current when it
was handed out; the learner applies each gradient as it arrives (Hogwild-style, as in
A3C). Faster when workers are slow or uneven, no longer equal to one process; ``grad_lag``
records how many optimizer steps old the parameters behind each applied gradient were.

PPO and A2C shard their minibatches (``ShardedPPO``). The replay algorithms (DQN family,
DDPG, TD3, SAC, Ape-X) shard each gradient step (``ShardedOffPolicy``): a step is the
algorithm's own ``phases`` generator (critic, then actor, then temperature for SAC), which
every worker runs on its rows of the batch, one round trip per optimizer step, so later
phases see the parameters the earlier ones stepped. The step's random draws come from the
learner (``draw_noise``, whole batch) and travel with it; sync gives the single-process
step up to float rounding. Async hands each worker a whole gradient step with the
parameters of the moment; its phase gradients are all taken at those parameters and
applied on arrival.

Nothing here imports Ray; ``corral.schemes.ray_scheme.RayGradPool`` runs the same
``GradientWorker`` in Ray actors.
"""

from __future__ import annotations

import dataclasses

import torch

from corral.algos.onpolicy import OnPolicy, PPOBatch
from corral.errors import TrainingError, UserError
from corral.rng import RNGStreams
from corral.storage.replay import ReplayBatch

_BATCH_FIELDS = [f.name for f in dataclasses.fields(ReplayBatch)]


class GradientWorker:
    """Holds a copy of the algorithm's networks and one update's batch; computes the
    gradient of the loss on any part of it with the parameters it is sent. Parameters and
    gradients travel as one flat tensor each (the layout of the algorithm's ``FlatAdam``)."""

    def __init__(self, cfg, obs_space, act_space, index: int = 0, threads: int = 1):
        torch.set_num_threads(max(1, threads))
        from corral.algos import get_algo

        # networks and optimizers (the flat layout gradients travel in), no storage
        self.algo = get_algo(cfg.algo).class_for(cfg.algo_cfg)(
            cfg.algo_cfg, obs_space, act_space, 1, torch.device("cpu"), RNGStreams(cfg.seed, "cpu", worker=10_000 + index),
            role="grad_worker")
        # the PPO family steps one optimizer; a replay algorithm's phases name theirs
        self.opt = self.algo.declared_optimizers()[0]
        self.batch: dict | None = None

    def load(self, batch: dict) -> None:
        self.batch = batch

    def gradient(self, params: torch.Tensor, idx: torch.Tensor | None, adv_stats, clip: float):
        """(flat grad, n, stats) of the mean loss over ``batch[idx]`` (all of it when None)."""
        self.opt.flat.copy_(params)
        mb = self.batch if idx is None else {k: v[idx] for k, v in self.batch.items()}
        if adv_stats is not None:
            mean, std = adv_stats
            mb = {**mb, "adv": (mb["adv"] - mean) / (std + 1e-8)}
        loss, stats = self.algo.minibatch_loss(mb["obs"], mb["actions"], mb["log_probs"], mb["values"], mb["adv"],
                                               mb["ret"], clip, False)  # adv arrives normalized
        self.opt.zero_grad()
        loss.backward()
        return self.opt.grad.clone(), int(mb["adv"].shape[0]), stats

    # --- replay algorithms: one gradient step, phase by phase
    def begin(self, tensors: torch.Tensor, grad_steps: int, rows: torch.Tensor | None):
        """Start a gradient step on ``rows`` of the loaded batch with the learner's tensors
        (one flat tensor, ``OffPolicy.synced_tensors`` order). Returns the first phase's
        ``("grad", optimizer index, flat grad, n)``."""
        algo = self.algo
        with torch.no_grad():  # in place: the parameters are views into the optimizers' flat buffers
            offset = 0
            for t in algo.synced_tensors():
                t.copy_(tensors[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        algo.grad_steps = grad_steps
        b = self.batch if rows is None else {k: v[rows] for k, v in self.batch.items()}
        batch = ReplayBatch(*(b[k] for k in _BATCH_FIELDS))
        noise = {k[6:]: v for k, v in b.items() if k.startswith("noise.")}
        self._n = int(batch.obs.shape[0])
        self._phases = algo.phases(batch, noise)
        return self._advance(first=True)

    def step_at(self, tensors: torch.Tensor, grad_steps: int, batch: dict):
        """Async: a whole gradient step on ``batch``, every phase's gradient taken at these
        parameters. Returns ``([(optimizer index, grad)...], n, stats, indices, td)``."""
        self.batch = batch
        out, grads = self.begin(tensors, grad_steps, None), []
        while out[0] == "grad":
            grads.append((out[1], out[2]))
            out = self._advance()
        _, n, stats, td = out
        return grads, n, stats, batch["indices"], td

    def resume(self, index: int, params: torch.Tensor):
        """The learner stepped optimizer ``index`` to ``params``: on to the next phase (or the
        step's ``("done", n, stats, td)``)."""
        self.algo.declared_optimizers()[index].flat.copy_(params)
        return self._advance()

    def _advance(self, first: bool = False):
        try:
            opt, loss = next(self._phases) if first else self._phases.send(None)
        except StopIteration as stop:
            stats, td = stop.value
            self._phases = None
            return ("done", self._n, {k: v.detach().float().cpu() for k, v in stats.items()},
                    None if td is None else td.detach().cpu())
        opt.zero_grad()
        loss.backward()
        index = next(i for i, o in enumerate(self.algo.declared_optimizers()) if o is opt)
        return ("grad", index, opt.grad.clone(), self._n)


class LocalGradPool:
    """Gradient workers in this process (tests, debugging); same interface as ``RayGradPool``."""

    def __init__(self, cfg, num_workers: int, obs_space, act_space):
        # this process's thread count stays as it is
        self.workers = [GradientWorker(cfg, obs_space, act_space, i, torch.get_num_threads())
                        for i in range(num_workers)]
        self.num_workers = num_workers
        self._pending: list = []

    def load(self, batch: dict) -> None:
        for w in self.workers:
            w.load(batch)

    def put(self, x):
        return x

    def gradients(self, params, jobs: list) -> list:
        return [w.gradient(params, *job) for w, job in zip(self.workers, jobs)]

    def call(self, method: str, jobs: list) -> list:
        """``method(*job)`` on worker i for the i-th job, all results in order."""
        return [getattr(w, method)(*job) for w, job in zip(self.workers, jobs)]

    def submit(self, w: int, params, tag, job, method: str = "gradient") -> None:
        self._pending.append((w, tag, job, params, method))

    def wait(self) -> tuple:
        w, tag, job, params, method = self._pending.pop(0)
        return w, tag, getattr(self.workers[w], method)(params, *job)

    def close(self) -> None:
        self._pending.clear()


def _average(results: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard gradients and stats averaged with weights n_i / sum n."""
    total = sum(n for _, n, _ in results)
    grad = sum(g * (n / total) for g, n, _ in results)
    stats = sum(s * (n / total) for _, n, s in results)
    return grad, stats


class ShardedPPO(OnPolicy):
    """An on-policy member (PPO, A2C, REINFORCE) whose minibatch gradients come from a pool of
    gradient workers: the family's update loop with ``minibatch_step`` (sync) or the whole
    minibatch pass (async) replaced."""

    pool = None
    mode = "sync"

    def attach(self, pool, mode: str) -> None:
        self.pool, self.mode = pool, mode

    def prepare_batch(self) -> PPOBatch:
        batch = super().prepare_batch()
        if self.pool is not None:
            cpu = lambda t: t.detach().to("cpu")  # noqa: E731
            self.pool.load({"obs": cpu(batch.obs), "actions": cpu(batch.actions), "log_probs": cpu(batch.log_probs),
                            "values": cpu(batch.values), "adv": cpu(batch.adv), "ret": cpu(batch.ret)})
        return batch

    def _adv_stats(self, batch: PPOBatch, idx):
        """Mean and std of the minibatch's advantages (the coupling the learner computes for all shards)."""
        if not self.cfg.normalize_advantage or idx is None:
            return None
        a = batch.adv[idx]
        return (a.mean().cpu(), a.std(correction=1 if a.numel() > 1 else 0).cpu())

    def _params(self):
        return self.pool.put(self.optimizer.flat.cpu().clone())

    def minibatch_step(self, batch: PPOBatch, idx, clip: float):
        if self.pool is None:
            return super().minibatch_step(batch, idx, clip)
        idx_all = torch.arange(batch.size) if idx is None else idx.cpu()
        adv = self._adv_stats(batch, idx)
        shards = [(s, adv, clip) for s in idx_all.tensor_split(self.pool.num_workers) if s.numel()]
        grad, stats = _average(self.pool.gradients(self._params(), shards))
        return stats.to(self.device), lambda: self._apply(grad)

    def train_minibatches(self, batch: PPOBatch, clip: float):
        if self.pool is None or self.mode == "sync":
            return super().train_minibatches(batch, clip)
        # async: each worker takes a whole minibatch at the parameters of the moment; every
        # gradient is applied as it lands (no target-KL stop: the steps are already in flight)
        queue = [(None if idx is None else idx.cpu(), self._adv_stats(batch, idx)) for idx in self.minibatch_plan(batch)]
        sums = torch.zeros(len(self.STATS))
        steps, lags, busy = 0, [], 0

        def submit(w):
            idx, adv = queue.pop(0)
            self.pool.submit(w, self._params(), steps, (idx, adv, clip))

        for w in range(min(self.pool.num_workers, len(queue))):
            submit(w)
            busy += 1
        while busy:
            w, tag, (grad, _, stats) = self.pool.wait()
            busy -= 1
            lags.append(steps - tag)
            self._apply(grad)
            sums += stats
            steps += 1
            if queue:
                submit(w)
                busy += 1
        return sums.to(self.device), steps, steps, ({"grad_lag": sum(lags) / len(lags)} if lags else {})

    def _apply(self, grad: torch.Tensor) -> None:
        """The averaged gradient into the optimizer's flat buffer; it clips and steps as in-process."""
        self.optimizer.zero_grad()
        self.optimizer.grad.copy_(grad.to(self.optimizer.grad.device))
        self.optimizer.step()


class ShardedOffPolicy:
    """Mixed in before a replay algorithm: its gradient steps run on a pool of gradient
    workers (see the module docstring). Everything else (sampling, priorities, targets,
    metrics, state) is the algorithm's own."""

    pool = None
    mode = "sync"
    capturable = False  # its steps run on the workers: no CUDA graph of them (corral.algos.graphed)

    def attach(self, pool, mode: str) -> None:
        self.pool, self.mode = pool, mode
        self._lags: list[int] = []
        self._busy: set[int] = set()
        self._applied = 0  # async steps applied so far (the clock of grad_lag)

    def _step_fields(self, batch: ReplayBatch) -> dict:
        """The step's batch and the learner's draws of its noise, as CPU tensors."""
        fields = {k: getattr(batch, k).detach().to("cpu") for k in _BATCH_FIELDS}
        fields.update({f"noise.{k}": v.detach().to("cpu") for k, v in self.draw_noise(batch.obs.shape[0]).items()})
        return fields

    def _flat_tensors(self) -> torch.Tensor:
        """Every synced tensor in one float64 vector (exact for float32 values and counts)."""
        return torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in self.synced_tensors()])

    def shared_targets(self, batch):
        # the workers compute their rows' targets themselves
        return None if self.pool is not None else super().shared_targets(batch)

    def _finish(self, results: list) -> tuple[dict, torch.Tensor | None]:
        """(stats, td) of a step from its shards' ``(n, stats, td)``, after the learner's ``after_step``."""
        total = sum(r[0] for r in results)
        stats = {k: sum(r[1][k] * (r[0] / total) for r in results).to(self.device) for k in results[0][1]}
        tds = [r[2] for r in results]
        td = None if tds[0] is None else torch.cat(tds).to(self.device)
        self.after_step(stats)
        return stats, td

    def _apply(self, index: int, grad: torch.Tensor) -> None:
        opt = self.declared_optimizers()[index]
        opt.zero_grad()
        opt.grad.copy_(grad.to(opt.grad.device))
        opt.step()

    def train_step(self, batch: ReplayBatch, shared=None):
        if self.pool is None:
            return super().train_step(batch, shared)
        if self.mode == "async":
            return self._async_step(batch)
        self.pool.load(self._step_fields(batch))  # one object, read by every worker
        tensors = self.pool.put(self._flat_tensors())
        rows = [r for r in torch.arange(batch.obs.shape[0]).tensor_split(self.pool.num_workers) if r.numel()]
        results = self.pool.call("begin", [(tensors, self.grad_steps, r) for r in rows])
        while results[0][0] == "grad":
            index = results[0][1]
            total = sum(r[3] for r in results)
            self._apply(index, sum(r[2] * (r[3] / total) for r in results))
            params = self.pool.put(self.declared_optimizers()[index].flat.cpu().clone())
            results = self.pool.call("resume", [(index, params)] * len(rows))
        return self._finish([r[1:] for r in results])

    def _async_step(self, batch: ReplayBatch):
        """Hand this whole step to a free worker at the current parameters; while every
        worker is busy, apply the step that lands first (priorities go to that step's own
        transitions). The update's metrics average the steps that landed in it."""
        pool = self.pool
        if len(self._busy) == pool.num_workers:
            self._land()
        w = min(set(range(pool.num_workers)) - self._busy)
        pool.submit(w, pool.put(self._flat_tensors()), self._applied,
                    (self.grad_steps, pool.put(self._step_fields(batch))), "step_at")
        self._busy.add(w)
        return {}, None

    def _land(self) -> None:
        w, tag, (grads, n, stats, indices, td) = self.pool.wait()
        self._busy.discard(w)
        self._lags.append(self._applied - tag)
        self._applied += 1
        for index, grad in grads:
            self._apply(index, grad)
        stats, td = self._finish([(n, stats, td)])
        if td is not None and self.cfg.prioritized:
            try:
                self.replay.update_priorities(indices.to(self.device), td)
            except ValueError as e:
                raise TrainingError(f"{self.name}: {e}") from None
        self._landed.append(stats)

    def update(self, progress: float) -> dict[str, float]:
        if self.pool is None or self.mode != "async":
            return super().update(progress)
        self._landed = []
        out = super().update(progress)  # dispatches; the steps' metrics come from the landed ones
        while self._busy:  # every step of this update lands in it
            self._land()
        keys = self._landed[0].keys() if self._landed else ()
        out.update({k: torch.stack([s[k] for s in self._landed if k in s]).mean().item() for k in keys})
        if self._lags:
            out["grad_lag"] = sum(self._lags) / len(self._lags)
            self._lags.clear()
        return self.checked(out)


def sharded_class(algo) -> type:
    """``type(algo)`` with the gradient-worker mixin its ``grad_sharding`` declares."""
    cls = type(algo)
    mixin = {"minibatches": ShardedPPO, "steps": ShardedOffPolicy}.get(cls.grad_sharding)
    if mixin is None:
        why = f": {cls.grad_sharding_note}" if cls.grad_sharding_note else \
            " (it is wired for ppo, a2c, reinforce and the replay algorithms)"
        raise UserError(f"scheme.grad_workers > 1 splits each update, not for {algo.name}{why}; set "
                        "scheme.grad_workers=1 (collectors scale collection for every algorithm)")
    return type(f"Sharded{cls.__name__}", (mixin, cls), {"name": cls.name, "Config": cls.Config})
