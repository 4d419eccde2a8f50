"""The Learner loop: a stream of update events that hooks consume.

``Learner.stream()`` does the collecting and learning and yields after each
update; logging, progress, evaluation, checkpointing and early stopping are hooks
(``corral.train.hooks``) that read the learner's counters. Run setup (env, device,
presets, config, run directory) is ``corral.train.setup``. Nothing here knows an
algorithm's math.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from corral import config as C
from corral.actors.normalizer import normalizers
from corral.algos import get_algo
from corral.algos.base import Step
from corral.envs.base import episode_done
from corral.errors import TrainingError, UserError
from corral.kernels.compiled import check_compile, update_mode
from corral.kernels.precision import check_matmul
from corral.rng import RNGStreams
from corral.train.checkpoint import save_checkpoint
from corral.train.hooks import CheckpointHook, EvalHook, MetricsHook, ProgressHook
from corral.train.setup import build_config, keep_heap, make_env, new_run_dir, resolve_device
from corral.train.tally import EpisodeTally


def check_agents(cls, env, cfg) -> None:
    """A multi-agent algorithm needs a multi-agent env and the other way round."""
    from corral.envs.multiagent import is_multiagent_space
    from corral.errors import UserError

    env_ma = is_multiagent_space(env.single_observation_space)
    if env_ma and not cls.multi_agent:
        raise UserError(f"env {cfg.env.id!r} is multi-agent and {cfg.algo} is a single-agent algorithm; use a "
                        "multi-agent one (ippo, mappo, vdn, qmix)")
    if cls.multi_agent and not env_ma:
        raise UserError(f"{cfg.algo} is a multi-agent algorithm and env {cfg.env.id!r} is not a PettingZoo env; "
                        "give mpe:NAME, pettingzoo:family.name or a module:callable returning a PettingZoo env")
    if cls.multi_agent and cfg.scheme.grad_workers > 1:
        raise UserError(f"{cfg.algo}: gradient workers are not built for multi-agent algorithms yet; leave "
                        "scheme.grad_workers at 1")
    if cls.multi_agent and cfg.scheme.collectors > 1 and not cls.multi_agent_collectors:
        raise UserError(f"{cfg.algo}: Ray collectors are built for the on-policy multi-agent algorithms (ippo, "
                        "mappo), not this one yet; leave scheme.collectors at 1")


@dataclass
class Learner:
    cfg: C.TrainConfig
    run_dir: Path | None = None
    env_spec: Any = None  # what the user passed (an id, a class, an instance); defaults to cfg.env.id
    quiet: bool = False
    env: Any = None  # a VecEnv built by the caller (a problem's batched env); default: from the config
    algo_cls: Any = None  # the Algorithm class (a problem's PPO with its own actor); default: the registry's
    # counters (all in the checkpoint)
    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    train_seconds: float = 0.0
    best_eval: float = -math.inf
    next_eval: int | None = None
    next_ckpt: int | None = None
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=20))
    # the distributed scheme while one runs (its collectors' resume states go into checkpoints),
    # and a resumed checkpoint's scheme state until a scheme takes it
    scheme: Any = None
    saved_scheme_state: list | None = None
    # transient
    new_returns: list = field(default_factory=list)
    new_lengths: list = field(default_factory=list)
    last_metrics: dict = field(default_factory=dict)
    last_eval: dict | None = None
    eval_seconds: float = 0.0  # of this process's evaluations (within train_seconds)
    eval_history: list = field(default_factory=list)  # {"step", "eval_return", "train_seconds" without evals}
    failed: bool = False
    # ``pause()``: the run ends at the next update boundary with a checkpoint, unfinished
    paused: bool = False
    _pause_requested: bool = False
    _stream: Any = None  # the update stream of a run in progress (``start``)
    _evaluator: Any = None
    _finished: bool = False
    # called as episode_log(name, returns, lengths) with the episodes that ended, per env
    # ("0", "1", ...) in-process, per collector ("c0", ...) with Ray (Monitor CSVs: log.monitor_csv)
    episode_log: Any = None

    def __post_init__(self):
        cfg = self.cfg
        torch.set_num_threads(max(1, cfg.threads))
        if cfg.keep_heap:
            keep_heap()
        self.device = resolve_device(cfg.device)
        check_matmul(cfg.matmul, self.device)
        check_compile(cfg.compile, self.device)
        self.env_spec = self.env_spec if self.env_spec is not None else cfg.env.id
        self.rng = RNGStreams(cfg.seed, self.device)
        if self.env is None:
            self.env = make_env(cfg, self.env_spec, self.device)
        cls = self.algo_cls or get_algo(cfg.algo).class_for(cfg.algo_cfg)
        check_agents(cls, self.env, cfg)
        self.algo = cls(cfg.algo_cfg, self.env.single_observation_space, self.env.single_action_space,
                        self.env.num_envs, self.device, self.rng)
        self.algo.total_steps = cfg.steps
        # A device-resident env (torch-batched, ``native:``) steps with no host read; the loop
        # keeps it that way: episodes are tallied on the device and read once per update, and
        # normalizers check their inputs once per update instead of once per step.
        self.device_resident = bool(getattr(self.env, "device_resident", False))
        self._norms = normalizers(*self.algo.declared_networks())
        for norm in self._norms:
            norm.defer_checks = self.device_resident
        self.obs = self.env.reset(seed=self.rng.env_seed())
        from corral.train.loggers import check_log_config

        check_log_config(self)

    @classmethod
    def from_scheme(cls, scheme, steps: int, *, seed: int = 0, run_dir: str | Path | None = None,
                    device: str = "auto", quiet: bool = False, use_preset: bool = False,
                    sets: list[str] | tuple = (), **overrides) -> Learner:
        """The Learner for a run composed in Python (``corral.compose``: a ``VecEnvFactory``, an
        ``AlgoFactory`` and a ``Scheme`` of both). Its parts become the run's typed config, so
        the run is an ordinary one. ``run_dir``: where the config, metrics, TensorBoard events and
        checkpoints go (None: nothing but the monitor logs a ``log_dir`` asks for);
        ``use_preset``: start from the (algo, env id) preset as ``corral train`` does;
        ``overrides``/``sets``: any other config keys (``eval.every``)."""
        from corral.compose import Scheme

        if not isinstance(scheme, Scheme):
            raise UserError(f"Learner.from_scheme: give a corral.Scheme, got {type(scheme).__name__}")
        settings = {**scheme.envs.settings(), **scheme.algo.settings(), **scheme.settings(), **overrides}
        cfg = build_config(scheme.algo.name, scheme.envs.env_fn, steps=steps, seed=seed, device=device,
                           overrides=settings, sets=sets, use_preset=use_preset)
        learner = cls(cfg, None, env_spec=scheme.envs.env_fn, quiet=quiet)  # bad input leaves no run dir
        if run_dir is not None:
            learner.run_dir = new_run_dir(cfg, str(run_dir))
            (learner.run_dir / "config.yaml").write_text(C.dump_yaml(cfg))
        return learner

    # --- bookkeeping: every loop (in-process, collectors' fragments, replay servers) counts here
    def add_steps(self, n: int) -> None:
        self.env_steps += n

    def add_episodes(self, returns: list[float], lengths: list[float]) -> None:
        """Whole episodes that ended (``corral.envs.base.episode_done``), in the order they ended."""
        if returns:
            self.episodes += len(returns)
            self.recent_returns.extend(returns)
            self.new_returns.extend(returns)
            self.new_lengths.extend(lengths)

    @property
    def last20_return(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else float("nan")

    # --- the stream
    def stream(self):
        """Collect and learn; yields each update's metrics. A consumer may set ``self.obs``
        between updates (a problem that moves its env's start states): the loop goes on from it."""
        algo, env = self.algo, self.env
        n = env.num_envs
        obs = self.obs
        total = self.cfg.steps
        tally = EpisodeTally(n, self.device) if self.device_resident else None
        no_grad = torch.no_grad()
        # the hooks most algorithms leave as the base class's no-ops: not called, not even the | of them
        rewarded, ended = algo.step_hooks()
        explore, observe, step = algo.explore, algo.observe, env.step
        while self.env_steps < total:
            with no_grad:
                env_action, extras = explore(obs)
                next_obs, reward, terminated, truncated, info = step(env_action)
                observe(Step(obs, extras, reward, terminated, truncated, info["final_obs"], next_obs,
                             agents=info.get("agents")))
                if rewarded is not None:
                    rewarded(reward)
                if ended is not None:
                    ended(terminated | truncated)
            obs = next_obs
            self.obs = obs
            self.add_steps(n)
            done = episode_done(info, terminated, truncated)
            if tally is None:
                if done.any():
                    self.add_episodes(info["episode_return"][done].tolist(), info["episode_length"][done].tolist())
                    if self.episode_log is not None:
                        self.log_env_episodes(done, info)
            elif tally.add(done, info["episode_return"], info["episode_length"]):
                self.add_tallied(tally)
            if algo.ready():
                if tally is not None:
                    self.add_tallied(tally)
                    self.check_finite()
                with update_mode(self.cfg):
                    stats = algo.update(min(1.0, self.env_steps / total))
                yield stats
                obs = self.obs
        if tally is not None:
            self.add_tallied(tally)

    def add_tallied(self, tally: EpisodeTally) -> None:
        returns, lengths = tally.flush()
        self.add_episodes(returns, lengths)
        if self.episode_log is not None and returns:
            self.episode_log("all", returns, lengths)  # a device-resident run's episodes, not per env

    def log_env_episodes(self, done: torch.Tensor, info: dict) -> None:
        for i in done.nonzero().flatten().tolist():
            self.episode_log(str(i), [float(info["episode_return"][i])], [int(info["episode_length"][i])])

    def check_finite(self) -> None:
        """The deferred input checks of a device-resident run's normalizers."""
        for norm in self._norms:
            try:
                norm.check_finite()
            except ValueError as e:
                raise TrainingError(f"{self.cfg.env.id}: {e}") from None

    def make_stream(self):
        """The in-process stream, or the distributed one when the scheme asks for workers."""
        sc = self.cfg.scheme
        if sc.collectors <= 1 and sc.grad_workers <= 1:
            return self.stream()
        from corral.train.scheme_factory import make_scheme  # registered by corral.schemes (import corral)

        return make_scheme(self).stream()

    # --- a run: ``train()``, or stepped (``start``, ``step`` until ``done``, ``close``)
    def start(self, hooks: list | None = None) -> Learner:
        """Set a run up to be driven one update at a time::

            learner.start()
            while not learner.done():
                learner.step()
                learner.print_info()
            summary = learner.close()

        ``hooks``: more objects called as ``hook(learner, stats)`` after every update (after the
        built-in metrics, evaluation and checkpoint hooks) and ``hook.close(learner)`` at the end;
        a hook sets ``learner.stop = True`` to end the run there. ``train()`` is exactly this loop."""
        cfg = self.cfg
        metrics = MetricsHook(self)
        self._evaluator = EvalHook(self, metrics)
        # evaluation before the checkpoint of the same update: the checkpoint then holds the
        # evaluation schedule past it, and a resumed run evaluates where one never stopped would
        checkpoint = [CheckpointHook(self)] if self.run_dir is not None else []
        progress = []
        if cfg.progress and not self.quiet:
            self._evaluator.progress = ProgressHook(self)
            progress = [self._evaluator.progress]
        self._hooks: list[Any] = [*progress, metrics, self._evaluator, *checkpoint, *(hooks or [])]
        # closing: the user's hooks, the final evaluation, then the last checkpoint (it holds
        # the final evaluation's counters), then the metrics and the progress bar
        self._closing = [*reversed(hooks or []), self._evaluator, *checkpoint, metrics, *progress]
        self.stop = False
        self.paused = False  # a pause asked for before the run started still takes effect
        self._t0 = time.perf_counter() - self.train_seconds
        self._stopped_early = self._finished = False
        self._updates_here = 0
        self._stream = self.make_stream()
        return self

    def done(self) -> bool:
        """The run reached ``cfg.steps`` or an early stop (``stop_at_return``, ``eval.stop_at_return``,
        a hook's ``stop``), or was paused (``pause()``)."""
        return self._finished

    def step(self) -> dict | None:
        """One update: collection up to it, the update, then every hook (metrics, checkpoints,
        evaluation). Returns the update's metrics, or None when the run is done."""
        if self._stream is None:
            if self._finished:
                return None
            raise RuntimeError("Learner.step(): call start() first (or train() for the whole run)")
        if self._finished:
            return None
        cfg = self.cfg
        try:
            # Training time ends with the last update: stopping workers afterwards (a Ray
            # shutdown takes a second or two) is teardown, not training.
            stats = next(self._stream)
        except StopIteration:
            self._finished = True
            if self._updates_here == 0:
                self.train_seconds = time.perf_counter() - self._t0
            return None
        except BaseException:
            self.failed = True
            raise
        self.train_seconds = time.perf_counter() - self._t0
        self._updates_here += 1
        self.updates += 1
        try:
            for hook in self._hooks:
                hook(self, stats)
        except BaseException:
            self.failed = True
            raise
        ev = self._evaluator
        if (self.stop
                or (cfg.stop_at_return is not None and len(self.recent_returns) == self.recent_returns.maxlen
                    and self.last20_return >= cfg.stop_at_return)
                or (cfg.eval.stop_at_return is not None and ev.last_step == self.env_steps
                    and cast(dict, self.last_eval)["mean_return"] >= cfg.eval.stop_at_return)):  # the eval just made
            self._stopped_early = self._finished = True
        if self._pause_requested and not self._finished and self.algo.at_boundary:
            # where the checkpoint hook would write one: resuming it continues the run exactly
            if self.run_dir is not None:
                self.save(self.run_dir / "checkpoints" / "latest.pt")
            self.paused = self._finished = True
            self._pause_requested = False
        return stats

    def pause(self) -> None:
        """End the run at the next update boundary, unfinished: with a run directory, its state
        goes to ``checkpoints/latest.pt`` there (``corral resume`` then continues exactly as if
        the run had never stopped); no final evaluation. ``done()`` turns true, ``paused`` tells it
        from a finished run. Safe to call from a signal handler (``pause_on_signals``)."""
        self._pause_requested = True

    def close(self) -> dict:
        """End the run (the final evaluation and checkpoint, workers stopped, envs closed) and
        return the summary ``train()`` returns."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()  # a scheme's workers stop here
        if self._updates_here == 0 and not self.failed:
            self.train_seconds = time.perf_counter() - self._t0
        try:
            for hook in self._closing:
                try:
                    hook.close(self)
                except Exception:
                    if not self.failed:
                        raise
        finally:
            self.env.close()
        summary: dict[str, Any] = {
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "env_steps": self.env_steps,
            "train_seconds": round(self.train_seconds, 3),
            "eval_seconds": round(self.eval_seconds, 3),
            "episodes": self.episodes,
            "last20_return": self.last20_return if self.recent_returns else None,
            "stopped_early": self._stopped_early,
            "paused": self.paused,
        }
        if self.last_eval:
            summary["eval_return"] = self.last_eval["mean_return"]
            summary["eval_return_std"] = self.last_eval["std_return"]
            summary["eval"] = self.last_eval  # every statistic, with the protocol
        return summary

    def train(self, hooks: list | None = None) -> dict:
        """Run to ``cfg.steps`` (or the early stop); returns the summary printed by ``--json``.
        The same as ``start(hooks)``, ``step()`` until ``done()``, then ``close()``."""
        self.start(hooks)
        try:
            while self.step() is not None and not self.done():
                pass
        except BaseException:
            self.failed = True
            self.close()
            raise
        return self.close()

    def print_info(self) -> None:
        """One line on stdout: env steps, updates, episodes, the last-20 return, the last evaluation."""
        ev = f", eval {self.last_eval['mean_return']:.1f}" if self.last_eval else ""
        sps = self.env_steps / self.train_seconds if self.train_seconds > 0 else float("nan")
        print(f"{self.cfg.algo} {self.cfg.env.id}: {self.env_steps:,}/{self.cfg.steps:,} steps, {self.updates} updates, "
              f"{self.episodes} episodes, last-20 return {self.last20_return:.1f}{ev}, {sps:,.0f} steps/s")

    def save_model(self, path: str | Path | None = None) -> Path:
        """The whole training state (``corral resume`` and ``corral.load`` take it); default
        ``<run dir>/checkpoints/latest.pt``."""
        if path is None:
            if self.run_dir is None:
                raise UserError("Learner.save_model(): this run has no run directory; pass a path")
            path = self.run_dir / "checkpoints" / "latest.pt"
        return self.save(Path(path))

    def evaluate(self) -> dict:
        """An evaluation now, under the run's protocol (``eval.*``), logged like the periodic ones."""
        if self._evaluator is None:
            self._evaluator = EvalHook(self, MetricsHook(self))
        return self._evaluator.evaluate(self)

    # --- state
    def state_dict(self, replay: bool = True) -> dict:
        """The whole training state; ``replay=False`` leaves the replay buffer out (what
        acting and evaluation need: ``best.pt``, ``step-*.pt``)."""
        algo = self.algo.state_dict()
        if not replay:
            algo.pop("replay", None)
        state = {
            "config": C.to_dict(self.cfg),
            "algo": algo,
            "env": self.env.state_dict(),
            "obs": self.obs.cpu(),
            "rng": self.rng.state_dict(),
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "updates": self.updates,
                "train_seconds": self.train_seconds,
                "best_eval": self.best_eval if math.isfinite(self.best_eval) else None,
                "next_eval": self.next_eval,
                "next_ckpt": self.next_ckpt,
                "recent_returns": list(self.recent_returns),
            },
            "torch_version": str(torch.__version__),
        }
        if self.scheme is not None:
            collectors = self.scheme.resume_states()
            if collectors:
                state["collectors"] = collectors
        return state

    def save(self, path: Path, replay: bool = True) -> Path:
        return save_checkpoint(self.state_dict(replay), path)

    def load_state_dict(self, state: dict) -> None:
        self.algo.load_state_dict(state["algo"])
        reseeded = self.rng.load_state_dict(state["rng"])
        if reseeded:
            saved = state["rng"].get("device") or ("cpu" if state["rng"][reseeded[0]].numel() == 5056 else "cuda")
            print(f"note: the checkpoint's random streams ({', '.join(reseeded)}) come from {saved} generators, "
                  f"which cannot be loaded into {self.device.type} ones; they are reseeded from their saved "
                  "state (deterministic, but not the draws the original device would have made); resume on "
                  f"--device {saved} to continue them exactly", file=sys.stderr)
        c = state["counters"]
        self.env_steps = int(c["env_steps"])
        self.episodes = int(c["episodes"])
        self.updates = int(c.get("updates", 0))  # checkpoints before the update count was kept: 0
        self.train_seconds = float(c["train_seconds"])
        self.best_eval = -math.inf if c["best_eval"] is None else float(c["best_eval"])
        self.next_eval, self.next_ckpt = c["next_eval"], c["next_ckpt"]
        self.recent_returns = deque(c["recent_returns"], maxlen=20)
        env_state, obs = state["env"], state["obs"]
        collectors = state.get("collectors")
        if collectors:
            if self.cfg.scheme.collectors > 1:
                self.saved_scheme_state = collectors  # the scheme hands them out, one per collector
            if collectors[0].get("env") is not None and collectors[0]["obs"].shape == self.obs.shape:
                # in-process (or another collector count): collector 0's episodes go on here,
                # with its per-env state (a recurrent policy's memory of them)
                env_state, obs = collectors[0]["env"], collectors[0]["obs"]
                if self.algo.recurrent and collectors[0].get("column"):
                    self.algo.load_column_state(collectors[0]["column"])
        if self.env.load_state_dict(env_state):
            self.obs = obs.to(self.device)
        else:
            print(f"note: env {self.cfg.env.id!r} cannot be copied into a checkpoint; "
                  "the resumed run starts fresh episodes", file=sys.stderr)
            self.obs = self.env.reset(seed=self.rng.env_seed() + self.env_steps)
