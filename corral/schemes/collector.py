"""Collection away from the learner: a ``Collector`` owns a vector env and a copy of the
algorithm's actor and hands back fragments of experience. Nothing here imports Ray; the
Ray scheme wraps these objects in actors, and ``LocalPool`` runs them in-process.

A fragment is ``T`` vector steps of ``N`` envs with everything ``Algorithm.observe``
takes, so the learner replays it step by step into its own algorithm exactly as the
in-process loop would. The last step of a fragment is a boundary: the learner sees it as
a truncation whose final observation is the real next observation, so returns, GAE,
V-trace and replay targets bootstrap there and never run into whatever the learner is
fed next in the same column (another collector's fragment, or a fresh env after a
restart).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from corral.actors.normalizer import RunningNormalizer, normalizers
from corral.algos.base import Step, index_record, map_record, stack_records
from corral.envs.base import episode_done
from corral.rng import RNGStreams


@dataclass
class FragmentMeta:
    """What the learner needs about a fragment without its data (small; always fetched)."""

    worker: int
    generation: int  # how many times this collector slot was restarted
    version: int  # the policy version the fragment was collected with
    steps: int  # T * N env steps
    seconds: float  # collection time (for steps/s)
    episodes: list = field(default_factory=list)  # (t, return, length) of every episode that ended
    norm_deltas: list = field(default_factory=list)  # (count, mean, var) per normalizer, since the last fragment
    resume: dict | None = None  # env state, obs and RNG at the fragment's end (copyable envs), for checkpoints


@dataclass
class FragmentData:
    """``T`` vector steps of ``N`` envs."""

    obs: torch.Tensor  # [T + 1, N, *obs]; obs[t + 1] is the observation after step t
    extras: Any  # the algorithm's extras record, each field [T, N, ...]
    reward: torch.Tensor  # [T, N]
    terminated: torch.Tensor  # [T, N] bool, as the env reported
    truncated: torch.Tensor  # [T, N] bool, as the env reported
    final_obs: torch.Tensor  # [D, *obs] true final observations where terminated | truncated, in nonzero order
    priorities: torch.Tensor | None = None  # [T, N] initial replay priorities (Ape-X), or None
    # a multi-agent env's per-agent rewards and flags (``AgentStep``, each [T, N, A]), or None
    agents: Any = None

    @property
    def length(self) -> int:
        return int(self.reward.shape[0])

    def to(self, device: torch.device) -> "FragmentData":
        if self.obs.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return FragmentData(move(self.obs), map_record(self.extras, move), move(self.reward),
                            move(self.terminated), move(self.truncated), move(self.final_obs), move(self.priorities),
                            None if self.agents is None else map_record(self.agents, move))

    def head(self, rows: int) -> "FragmentData":
        """The first ``rows`` steps as a fragment of their own (its last step the boundary)."""
        if rows >= self.length:
            return self
        done = self.terminated[:rows] | self.truncated[:rows]
        return FragmentData(self.obs[:rows + 1], index_record(self.extras, slice(None, rows)), self.reward[:rows],
                            self.terminated[:rows], self.truncated[:rows], self.final_obs[:int(done.sum())],
                            None if self.priorities is None else self.priorities[:rows],
                            None if self.agents is None else index_record(self.agents, slice(None, rows)))

    def true_next_obs(self) -> torch.Tensor:
        """``[T, N, *obs]``: the observation after each step within its episode (final_obs where one ended)."""
        nxt = self.obs[1:].clone()
        done = self.terminated | self.truncated
        if self.final_obs.shape[0]:
            nxt[done] = self.final_obs.to(nxt.dtype)
        return nxt

    def boundary_truncated(self) -> torch.Tensor:
        """``truncated`` with the fragment's last step marked: the learner bootstraps there."""
        trunc = self.truncated.clone()
        trunc[-1] = True
        return trunc

    def steps(self):
        """The ``Step`` records ``observe`` takes; the last one marks the fragment's boundary
        in ``truncated`` and carries the env's own flags in ``env_truncated`` (a multi-agent
        algorithm marks its agents' columns there itself: ``agents`` holds the env's flags)."""
        final = self.true_next_obs()
        trunc = self.boundary_truncated()
        last = self.length - 1
        for t in range(self.length):
            yield Step(self.obs[t], index_record(self.extras, t), self.reward[t], self.terminated[t], trunc[t],
                       final[t], self.obs[t + 1], self.truncated[t] if t == last else None,
                       None if self.agents is None else index_record(self.agents, t))

    @property
    def nbytes(self) -> int:
        tensors = [self.obs, self.reward, self.terminated, self.truncated, self.final_obs, *self.extras,
                   *(self.agents or ())]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ---------------------------------------------------------------------------
# Observation-normalizer statistics: what a worker saw since its last report.


class NormalizerTap:
    """Folds every batch a normalizer folds into a second, delta normalizer as well, so a
    worker can report the count, mean and variance of what it saw since its last report.
    The learner merges those deltas (``RunningNormalizer.merge``, exact) and broadcasts the
    result, so every worker and every checkpoint holds the same statistics."""

    def __init__(self, norm: RunningNormalizer):
        self.norm = norm
        self.delta = RunningNormalizer(tuple(norm.mean.shape), enabled=True).to(norm.mean.device)
        self.delta.count.zero_()
        inner = norm._update

        def _update(x: torch.Tensor) -> None:
            inner(x)
            self.delta._update(x)

        norm._update = _update  # an instance attribute: the module class is untouched

    def take(self) -> tuple[float, torch.Tensor, torch.Tensor]:
        d = self.delta
        out = (float(d.count), d.mean.clone(), d.var.clone())
        d.count.zero_()
        d.mean.zero_()
        d.var.fill_(1.0)
        return out


def merge_deltas(module: torch.nn.Module, deltas: list) -> None:
    """Merge one worker's normalizer deltas into ``module``'s normalizers (same order)."""
    for norm, (count, mean, var) in zip(normalizers(module), deltas):
        if norm.enabled and count > 0:
            norm.merge(torch.tensor(count, dtype=torch.float64), mean, var)


# ---------------------------------------------------------------------------
# What crosses to collectors: the acting part of an algorithm's state.


def collector_state(algo) -> dict[str, torch.Tensor]:
    """What a collector needs to act (``Algorithm.collector_state``: the declared ``acting``
    networks, normalizers included), on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in algo.collector_state().items()}


def state_nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _add_paths(paths: list[str]) -> None:
    """Let a worker import what the driver could (``module:callable`` envs, test helpers)."""
    for p in reversed(paths):
        if p and p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)


def driver_paths() -> list[str]:
    return [os.getcwd()] + [p for p in sys.path if p]


def portable_env_spec(spec: Any) -> Any:
    """``file.py:Name`` with a relative path becomes absolute, so a worker whose working
    directory differs still finds the file."""
    if isinstance(spec, str) and ":" in spec:
        target, _, attr = spec.rpartition(":")
        if target.endswith(".py") and not os.path.isabs(target):
            return f"{os.path.abspath(target)}:{attr}"
    return spec


class Collector:
    """A vector env plus a copy of the algorithm that only acts.

    Built from picklable inputs (the run config, the env spec), so a Ray worker on any node
    builds its own. ``collect`` loads the broadcast parameters when their version is new,
    steps ``T`` times and returns ``(FragmentMeta, FragmentData)``.
    """

    def __init__(self, cfg, env_spec: Any, index: int, num_workers: int, generation: int = 0,
                 paths: list[str] | None = None, init: dict | None = None, threads: int = 1):
        _add_paths(paths or [])
        torch.set_num_threads(max(1, threads))
        from corral.algos import get_algo
        from corral.train.setup import import_user_modules, make_env

        import_user_modules(cfg.imports)  # a user's registered algorithms and envs exist here too
        self.cfg, self.index, self.num_workers, self.generation = cfg, index, num_workers, generation
        self.device = torch.device("cpu")
        # Every (slot, generation) pair gets its own streams: a restarted collector does not
        # replay the episodes of the one it replaces.
        self.rng = RNGStreams(cfg.seed, self.device, worker=1 + index + num_workers * generation)
        # the run's env exactly as the learner builds it (backend, Atari wrappers, strict, on_error)
        self.env = make_env(cfg, env_spec, self.device)
        # an acting copy: no replay, no rollout storage, no optimizers
        self.algo = get_algo(cfg.algo).class_for(cfg.algo_cfg)(
            cfg.algo_cfg, self.env.single_observation_space, self.env.single_action_space, self.env.num_envs,
            self.device, self.rng, role="actor")
        self.algo.total_steps = cfg.steps
        self.algo.set_worker(index, num_workers)
        self.taps = [NormalizerTap(n) for n in normalizers(self.algo.actor)]
        self.version = -1
        self.length = self.algo.fragment_length()
        self.obs = self.env.reset(seed=self.rng.env_seed())
        # (reset first: Gymnasium's env checker refuses a step before the first reset)
        # ``init``: where to continue from, ``{"env", "obs"}`` and optionally ``"rng"`` (the
        # learner's own episodes, or this slot's state from a checkpoint)
        if init and init.get("env") is not None and self.env.load_state_dict(init["env"]):
            self.obs = init["obs"].to(self.device)  # continue those episodes exactly
            if init.get("rng") is not None:
                self.rng.load_state_dict(init["rng"])
            if init.get("column"):  # the episodes' per-env state (a recurrent policy's state)
                self.algo.load_column_state(init["column"])

    def spaces(self):
        return self.env.single_observation_space, self.env.single_action_space

    def ping(self) -> int:
        return os.getpid()

    def resume_state(self) -> dict | None:
        """Env state, observations and the streams acting draws from, or None where the env
        cannot be copied (a resume then starts fresh episodes)."""
        if not getattr(self.env, "copyable", False):
            return None
        rng = self.rng.state_dict()
        return {"env": self.env.state_dict(), "obs": self.obs.clone(),
                "rng": {k: rng[k] for k in ("action", "noise") if k in rng},
                "column": {k: v.clone() for k, v in self.algo.column_state().items()}}

    def collect(self, params: dict | None, version: int, env_steps: int = 0, want_state: bool = False):
        t0 = time.perf_counter()
        algo, env = self.algo, self.env
        if params is not None and version != self.version:
            algo.load_collector_state(params)
            self.version = version
        algo.set_env_steps(env_steps)  # schedules (epsilon, warm-up) follow the whole run
        T, N = self.length, env.num_envs
        obs = self.obs
        obs_buf = torch.empty((T + 1, *obs.shape), dtype=obs.dtype)
        rew = torch.empty((T, N), dtype=torch.float32)
        term = torch.empty((T, N), dtype=torch.bool)
        trunc = torch.empty((T, N), dtype=torch.bool)
        extras_steps: list[dict] = []
        agent_steps: list = []  # a multi-agent env's per-agent results (info["agents"])
        finals: list[torch.Tensor] = []
        episodes: list[tuple[int, float, int]] = []
        with torch.no_grad():
            for t in range(T):
                obs_buf[t] = obs
                env_action, extras = algo.explore(obs)
                next_obs, reward, terminated, truncated, info = env.step(env_action)
                rew[t], term[t], trunc[t] = reward, terminated, truncated
                extras_steps.append(extras)
                if "agents" in info:
                    agent_steps.append(info["agents"])
                ended = terminated | truncated
                algo.rewarded(reward)
                algo.episodes_ended(ended)
                if ended.any():
                    finals.append(info["final_obs"][ended])
                    # whole episodes only (an Atari life lost is not one), as the Learner counts them
                    done = episode_done(info, terminated, truncated)
                    for r, n_ in zip(info["episode_return"][done].tolist(), info["episode_length"][done].tolist()):
                        episodes.append((t, r, int(n_)))
                obs = next_obs
        obs_buf[T] = obs
        self.obs = obs
        extras = stack_records(extras_steps)
        final = torch.cat(finals) if finals else obs_buf.new_empty((0, *obs.shape[1:]))
        data = FragmentData(obs_buf, extras, rew, term, trunc, final,
                            agents=stack_records(agent_steps) if agent_steps else None)
        with torch.no_grad():
            data.priorities = algo.initial_priorities(data)
        meta = FragmentMeta(self.index, self.generation, version, T * N, time.perf_counter() - t0, episodes,
                            [tap.take() for tap in self.taps], self.resume_state() if want_state else None)
        return meta, data

    def close(self) -> None:
        self.env.close()
