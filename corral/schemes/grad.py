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

PPO is the algorithm wired for this so far (``ShardedPPO``). Nothing here imports Ray;
``corral.schemes.ray_scheme.RayGradPool`` runs the same ``GradientWorker`` in Ray actors.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from corral.algos.ppo import PPO, ppo_batch, ppo_loss, ppo_schedules
from corral.errors import TrainingError, UserError
from corral.rng import RNGStreams


def minibatch_loss(algo: PPO, mb: dict, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's loss on a dict of flat tensors whose ``adv`` is already normalized."""
    return ppo_loss(algo.actor, mb["obs"], mb["actions"], mb["log_probs"], mb["values"], mb["adv"], mb["ret"],
                    clip, algo.cfg)


class GradientWorker:
    """Holds a copy of the algorithm's networks and one update's batch; computes the
    gradient of the loss on any part of it with the parameters it is sent. Parameters and
    gradients travel as one flat tensor each (the layout of the algorithm's ``FlatAdam``)."""

    def __init__(self, cfg, obs_space, act_space, index: int = 0, threads: int = 1):
        torch.set_num_threads(max(1, threads))
        from corral.algos import get_algo

        algo_cfg = cfg.algo_cfg
        if hasattr(algo_cfg, "n_steps"):  # it never stores a rollout
            algo_cfg = dataclasses.replace(algo_cfg, n_steps=1, batch_size=1)
        self.algo = get_algo(cfg.algo).cls(algo_cfg, obs_space, act_space, 1, torch.device("cpu"),
                                           RNGStreams(cfg.seed, "cpu", worker=10_000 + index))
        self.opt = self.algo.optimizer
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
        loss, stats = minibatch_loss(self.algo, mb, clip)
        self.opt.zero_grad()
        loss.backward()
        return self.opt.grad.clone(), int(mb["adv"].shape[0]), stats


class LocalGradPool:
    """Gradient workers in this process (tests, debugging); same interface as ``RayGradPool``."""

    def __init__(self, cfg, num_workers: int, obs_space, act_space):
        self.workers = [GradientWorker(cfg, obs_space, act_space, i) for i in range(num_workers)]
        self.num_workers = num_workers
        self._pending: list = []

    def load(self, batch: dict) -> None:
        for w in self.workers:
            w.load(batch)

    def put(self, x):
        return x

    def gradients(self, params, jobs: list) -> list:
        return [w.gradient(params, *job) for w, job in zip(self.workers, jobs)]

    def submit(self, w: int, params, tag, job) -> None:
        self._pending.append((w, tag, job, params))

    def wait(self) -> tuple:
        w, tag, job, params = self._pending.pop(0)
        return w, tag, self.workers[w].gradient(params, *job)

    def close(self) -> None:
        self._pending.clear()


def _average(results: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard gradients and stats averaged with weights n_i / sum n."""
    total = sum(n for _, n, _ in results)
    grad = sum(g * (n / total) for g, n, _ in results)
    stats = sum(s * (n / total) for _, n, s in results)
    return grad, stats


class ShardedPPO(PPO):
    """PPO whose minibatch gradients come from a pool of gradient workers."""

    pool = None
    mode = "sync"

    def attach(self, pool, mode: str) -> None:
        self.pool, self.mode = pool, mode

    def update(self, progress: float) -> dict[str, float]:
        if self.pool is None:
            return super().update(progress)
        cfg = self.cfg
        lr, clip = ppo_schedules(cfg, self.optimizer, progress)
        with torch.no_grad():
            last_value = self.actor.value(self.actor.normalize(self._last_obs))
        b, adv_all, ret_all, full_batch = ppo_batch(cfg, self.storage.data, last_value)
        n = adv_all.shape[0]
        cpu = lambda t: t.detach().to("cpu")  # noqa: E731
        self.pool.load({"obs": cpu(b.obs), "actions": cpu(b.actions), "log_probs": cpu(b.log_probs),
                        "values": cpu(b.values), "adv": cpu(adv_all), "ret": cpu(ret_all)})

        # The same minibatches, drawn from the same stream, as PPO.update.
        jobs = []
        for _ in range(cfg.n_epochs):
            if full_batch:
                jobs.append(None)
            else:
                perm = torch.randperm(n, generator=self.rng["minibatch"], device=self.device)
                jobs += [perm[i:i + cfg.batch_size] for i in range(0, n - cfg.batch_size + 1, cfg.batch_size)]

        def adv_stats(idx):
            if not cfg.normalize_advantage or idx is None:
                return None
            a = adv_all[idx]
            return (a.mean().cpu(), a.std().cpu())

        sums = torch.zeros(5)
        count, lags = 0, []
        if self.mode == "sync":
            for j, idx in enumerate(jobs):
                idx_all = torch.arange(n) if idx is None else idx.cpu()
                stats_adv = adv_stats(idx)
                params = self.pool.put(self.optimizer.flat.cpu().clone())
                shards = [(s, stats_adv, clip) for s in idx_all.tensor_split(self.pool.num_workers) if s.numel()]
                grad, stats = _average(self.pool.gradients(params, shards))
                self._apply(grad)
                sums += stats
                count += 1
                if cfg.target_kl is not None and stats[3].item() > 1.5 * cfg.target_kl:
                    break  # as PPO.update: no more minibatches this update
        else:
            queue = list(enumerate(jobs))
            busy = 0
            for w in range(min(self.pool.num_workers, len(queue))):
                j, idx = queue.pop(0)
                self.pool.submit(w, self.pool.put(self.optimizer.flat.cpu().clone()), count,
                                 (None if idx is None else idx.cpu(), adv_stats(idx), clip))
                busy += 1
            while busy:
                w, tag, (grad, _, stats) = self.pool.wait()
                busy -= 1
                lags.append(count - tag)
                self._apply(grad)
                sums += stats
                count += 1
                if queue:
                    j, idx = queue.pop(0)
                    self.pool.submit(w, self.pool.put(self.optimizer.flat.cpu().clone()), count,
                                     (None if idx is None else idx.cpu(), adv_stats(idx), clip))
                    busy += 1

        self.storage.clear()
        self.updates += 1
        pg, v, ent, kl, cf = (sums / max(count, 1)).tolist()
        if not all(math.isfinite(x) for x in (pg, v, ent)):
            raise TrainingError(
                f"PPO loss became non-finite at update {self.updates} (pg_loss={pg}, v_loss={v}); "
                "lower ppo.lr, enable ppo.normalize_obs / normalize_reward, or check the env's rewards"
            )
        with torch.no_grad():
            var_ret = ret_all.var()
            explained_var = (1.0 - (ret_all - b.values).var() / var_ret).item() if var_ret > 0 else float("nan")
        out = {"pg_loss": pg, "v_loss": v, "entropy": ent, "approx_kl": kl, "clipfrac": cf,
               "explained_variance": explained_var, "lr": lr, "clip_range": clip, "minibatches": float(count)}
        if lags:
            out["grad_lag"] = sum(lags) / len(lags)
        return out

    def _apply(self, grad: torch.Tensor) -> None:
        """The averaged gradient into the optimizer's flat buffer; it clips and steps as in-process."""
        self.optimizer.zero_grad()
        self.optimizer.grad.copy_(grad)
        self.optimizer.step()


def sharded_class(algo) -> type:
    if type(algo) is PPO:
        return ShardedPPO
    raise UserError(f"scheme.grad_workers > 1 is wired for ppo so far, not {algo.name}; "
                    "set scheme.grad_workers=1 (collectors scale collection for every algorithm)")
