"""The Learner loop: a stream of update events that hooks consume.

``Learner.stream()`` does the collecting and learning and yields after each
update; logging, progress, evaluation, checkpointing and early stopping are hooks
that read the learner's counters. Nothing here knows an algorithm's math.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from corral import config as C
from corral.algos import get_algo
from corral.envs import make_vec_env
from corral.envs.make import env_name
from corral.errors import UserError
from corral.rng import RNGStreams
from corral.train.checkpoint import save_checkpoint
from corral.train.evaluate import run_episodes, summarize

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def make_env(cfg: C.TrainConfig, spec: Any = None, device: Any = "cpu", num_envs: int | None = None,
             evaluation: bool = False):
    """The run's vector env from its config (evaluation: no episodic life, no reward clipping)."""
    ec = cfg.env
    if ec.on_error not in ("raise", "restart"):
        raise UserError(f"env.on_error must be 'raise' or 'restart', got {ec.on_error!r}")
    atari = ("eval" if evaluation else True) if ec.atari_wrappers else False
    return make_vec_env(spec if spec is not None else ec.id, num_envs or ec.num_envs, ec.kwargs, device, ec.backend,
                        atari_wrappers=atari, strict=ec.strict, on_error=ec.on_error)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name!r} asked for CUDA but no GPU is visible; use --device cpu or auto")
    return dev


def load_preset(algo: str, env_id: str, base: str | None = None) -> dict:
    """The preset for (algo, env): ``presets/<algo>.yaml`` keyed by env id."""
    for name in (algo, base):
        if name is None:
            continue
        path = PRESET_DIR / f"{name}.yaml"
        if path.is_file():
            presets = C.load_yaml(str(path))
            key = env_id.split(":", 1)[1] if env_id.startswith("native:") else env_id
            if key in presets:
                data = dict(presets[key])
                if name != algo and base in data:  # a variant reuses its base algorithm's section
                    data[algo] = data.pop(base)
                return data
    return {}


def list_presets() -> dict[str, list[str]]:
    return {p.stem: sorted(C.load_yaml(str(p))) for p in sorted(PRESET_DIR.glob("*.yaml"))}


def build_config(
    algo: str,
    env: Any,
    *,
    steps: int | None = None,
    seed: int | None = None,
    num_envs: int | None = None,
    device: str | None = None,
    config_file: str | None = None,
    sets: list[str] | tuple = (),
    overrides: dict | None = None,
    stop_at_return: float | None = None,
    use_preset: bool = True,
) -> C.TrainConfig:
    """Defaults < algorithm variant < preset < config file < explicit arguments < --set."""
    spec = get_algo(algo)
    cfg = C.TrainConfig(algo=algo, algo_cfg=spec.cls.Config())
    if spec.overrides:
        C.update_from_dict(cfg.algo_cfg, spec.overrides, algo + ".")
    env_id = env if isinstance(env, str) else env_name(env)
    cfg.env.id = env_id
    if use_preset:
        C.apply_dict(cfg, load_preset(algo, env_id, base=spec.cls.name))
    if config_file:
        data = C.load_yaml(config_file)
        if data.get("algo", algo) != algo:
            raise UserError(f"config file {config_file!r} is for algorithm {data['algo']!r}, not {algo!r}")
        C.apply_dict(cfg, data)
        cfg.env.id = env_id
    for name, value in (("steps", steps), ("seed", seed), ("device", device), ("stop_at_return", stop_at_return)):
        if value is not None:
            C.apply_set(cfg, [(name, value)])
    if num_envs is not None:
        C.apply_set(cfg, [("env.num_envs", num_envs)])
    if overrides:
        C.apply_set(cfg, list(overrides.items()))
    C.apply_set(cfg, C.parse_set(list(sets)))
    if cfg.steps <= 0:
        raise UserError(f"steps must be positive, got {cfg.steps}")
    return cfg


def new_run_dir(cfg: C.TrainConfig, run_dir: str | None, root: str = "runs") -> Path:
    """Create the run directory; never reuse an existing one."""
    if run_dir is None:
        safe_env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.id)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(root) / f"{cfg.algo}-{safe_env}-s{cfg.seed}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(root) / f"{cfg.algo}-{safe_env}-s{cfg.seed}-{stamp}-{n}"
    else:
        path = Path(run_dir)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UserError(
                f"run directory {str(path)!r} already exists; continue it with `corral resume {path}` "
                "or choose another --run-dir"
            )
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------
# Hooks: each reads the learner after an update event.


class MetricsHook:
    """Writes metrics.jsonl and TensorBoard scalars every ``log_every`` env steps."""

    def __init__(self, learner: "Learner"):
        self.every = max(1, learner.cfg.log_every)
        self.next = learner.env_steps + self.every
        self.file = open(learner.run_dir / "metrics.jsonl", "a") if learner.run_dir else None
        self.tb = None
        if learner.run_dir and learner.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(learner.run_dir / "tb"))
        self.last_steps, self.last_time = learner.env_steps, time.perf_counter()

    def write(self, learner: "Learner", record: dict) -> None:
        record = {"step": learner.env_steps, **record}
        learner.last_metrics.update(record)
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.tb:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, learner.env_steps)

    def __call__(self, learner: "Learner", stats: dict, final: bool = False) -> None:
        self.stats = stats
        if learner.env_steps < self.next and not final:
            return
        self.next = learner.env_steps + self.every
        now = time.perf_counter()
        sps = (learner.env_steps - self.last_steps) / max(now - self.last_time, 1e-9)
        self.last_steps, self.last_time = learner.env_steps, now
        record = {
            "episodes": learner.episodes,
            "steps_per_second": sps,
            "time": learner.train_seconds,
            **{k: v for k, v in stats.items()},
        }
        if learner.new_returns:
            record["episode_return"] = sum(learner.new_returns) / len(learner.new_returns)
            record["episode_length"] = sum(learner.new_lengths) / len(learner.new_lengths)
            learner.new_returns.clear()
            learner.new_lengths.clear()
        if learner.recent_returns:
            record["last20_return"] = learner.last20_return
        self.write(learner, record)

    def close(self, learner: "Learner") -> None:
        if learner.env_steps > self.last_steps and not learner.failed:
            self(learner, getattr(self, "stats", {}), final=True)
        if self.file:
            self.file.close()
        if self.tb:
            self.tb.close()


class EvalHook:
    """Deterministic evaluation on separate envs every ``eval.every`` steps and at the end;
    the best one is checkpointed as ``best.pt``."""

    def __init__(self, learner: "Learner", metrics: MetricsHook):
        ec = learner.cfg.eval
        self.every = ec.every
        self.next = learner.next_eval if learner.next_eval else (learner.env_steps + ec.every if ec.every > 0 else None)
        self.metrics = metrics
        self.env = None
        self.last_step = -1  # env steps at the last evaluation

    def evaluate(self, learner: "Learner") -> dict:
        ec = learner.cfg.eval
        if self.env is None:
            self.env = make_env(learner.cfg, learner.env_spec, learner.device, num_envs=ec.num_envs, evaluation=True)
        learner.algo.actor.eval()
        try:
            returns = run_episodes(lambda o: learner.algo.act(o, deterministic=ec.deterministic), self.env,
                                   ec.episodes, seed=learner.rng.env_seed("eval_env"))
        finally:
            learner.algo.actor.train()
        result = summarize(returns)
        if ec.video and self.metrics.tb is not None:
            self.log_video(learner)
        self.metrics.write(learner, {"eval_return": result["mean_return"], "eval_return_std": result["std_return"]})
        learner.last_eval = result
        self.last_step = learner.env_steps
        if result["mean_return"] > learner.best_eval:
            learner.best_eval = result["mean_return"]
            if learner.run_dir:
                learner.save(learner.run_dir / "checkpoints" / "best.pt")
        return result

    def log_video(self, learner: "Learner") -> None:
        """One deterministic episode (the first eval episode's seed) as ``eval/video`` in TensorBoard."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        from corral.envs.video import episode_gif

        cfg = learner.cfg
        learner.algo.actor.eval()
        try:
            gif, (h, w), _ = episode_gif(lambda o: learner.algo.act(o, deterministic=True), learner.env_spec,
                                         kwargs=cfg.env.kwargs, seed=learner.rng.env_seed("eval_env"),
                                         atari_wrappers="eval" if cfg.env.atari_wrappers else False,
                                         device=learner.device)
        finally:
            learner.algo.actor.train()
        # What SummaryWriter.add_video writes (a GIF as an image summary), without its moviepy dependency
        image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=gif)
        self.metrics.tb._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag="eval/video", image=image)]), learner.env_steps)

    def __call__(self, learner: "Learner", stats: dict) -> None:
        if self.next is not None and learner.env_steps >= self.next:
            self.next = learner.env_steps + self.every
            learner.next_eval = self.next
            self.evaluate(learner)

    def close(self, learner: "Learner") -> None:
        if learner.cfg.eval.episodes > 0 and not learner.failed:
            self.evaluate(learner)
        if self.env is not None:
            self.env.close()


class CheckpointHook:
    def __init__(self, learner: "Learner"):
        ck = learner.cfg.checkpoint
        self.every = ck.every
        self.keep = ck.keep
        self.next = learner.next_ckpt or (learner.env_steps + ck.every if ck.every > 0 else None)

    def __call__(self, learner: "Learner", stats: dict) -> None:
        if self.next is not None and learner.env_steps >= self.next and learner.algo.at_boundary:
            self.next = learner.env_steps + self.every
            learner.next_ckpt = self.next
            folder = learner.run_dir / "checkpoints"
            learner.save(folder / f"step-{learner.env_steps:010d}.pt")
            learner.save(folder / "latest.pt")
            for old in sorted(folder.glob("step-*.pt"))[: -self.keep or None]:
                old.unlink()

    def close(self, learner: "Learner") -> None:
        if not learner.failed:
            learner.save(learner.run_dir / "checkpoints" / "latest.pt")


class ProgressHook:
    """A rich progress bar on stderr: steps, steps/s, recent return, ETA."""

    def __init__(self, learner: "Learner"):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,} steps"),
            TextColumn("{task.fields[sps]:,.0f} steps/s"),
            TextColumn("return {task.fields[ret]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.progress.add_task(f"{learner.cfg.algo} {learner.cfg.env.id}", total=learner.cfg.steps,
                                           completed=learner.env_steps, sps=0.0, ret="-")
        self.progress.start()
        self.t0, self.s0 = time.perf_counter(), learner.env_steps
        self.last = 0.0

    def __call__(self, learner: "Learner", stats: dict) -> None:
        now = time.perf_counter()
        if now - self.last < 0.2:
            return
        self.last = now
        sps = (learner.env_steps - self.s0) / max(now - self.t0, 1e-9)
        ret = f"{learner.last20_return:.1f}" if learner.recent_returns else "-"
        self.progress.update(self.task, completed=learner.env_steps, sps=sps, ret=ret)

    def close(self, learner: "Learner") -> None:
        self.__call__(learner, {})
        self.last = 0.0
        self.progress.update(self.task, completed=learner.env_steps)
        self.progress.stop()


# ---------------------------------------------------------------------------


@dataclass
class Learner:
    cfg: C.TrainConfig
    run_dir: Path | None = None
    env_spec: Any = None  # what the user passed (an id, a class, an instance); defaults to cfg.env.id
    quiet: bool = False
    # counters (all in the checkpoint)
    env_steps: int = 0
    episodes: int = 0
    train_seconds: float = 0.0
    best_eval: float = -math.inf
    next_eval: int | None = None
    next_ckpt: int | None = None
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=20))
    # a distributed run's collectors: where each stands after its last consumed fragment
    # (set by the scheme; in the checkpoint), and what a resumed one hands its collectors
    collector_states: list | None = None
    resumed_collectors: list | None = None
    # transient
    new_returns: list = field(default_factory=list)
    new_lengths: list = field(default_factory=list)
    last_metrics: dict = field(default_factory=dict)
    last_eval: dict | None = None
    failed: bool = False

    def __post_init__(self):
        cfg = self.cfg
        torch.set_num_threads(max(1, cfg.threads))
        self.device = resolve_device(cfg.device)
        self.env_spec = self.env_spec if self.env_spec is not None else cfg.env.id
        self.rng = RNGStreams(cfg.seed, self.device)
        self.env = make_env(cfg, self.env_spec, self.device)
        spec = get_algo(cfg.algo)
        self.algo = spec.cls(cfg.algo_cfg, self.env.single_observation_space, self.env.single_action_space,
                             self.env.num_envs, self.device, self.rng)
        self.algo.total_steps = cfg.steps
        self.obs = self.env.reset(seed=self.rng.env_seed())

    @property
    def last20_return(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else float("nan")

    # --- the stream
    def stream(self):
        algo, env = self.algo, self.env
        n = env.num_envs
        obs = self.obs
        total = self.cfg.steps
        no_grad = torch.no_grad()
        while self.env_steps < total:
            with no_grad:
                env_action, extras = algo.explore(obs)
                next_obs, reward, terminated, truncated, info = env.step(env_action)
                algo.observe(obs, extras, reward, terminated, truncated, info["final_obs"], next_obs)
            obs = next_obs
            self.obs = obs
            self.env_steps += n
            # a whole episode ended (not a lost Atari life, not a restarted env's dropped episode)
            done = info.get("episode_done", terminated | truncated)
            if done.any():
                rets = info["episode_return"][done].tolist()
                lens = info["episode_length"][done].tolist()
                self.episodes += len(rets)
                self.recent_returns.extend(rets)
                self.new_returns.extend(rets)
                self.new_lengths.extend(lens)
            if algo.ready():
                stats = algo.update(min(1.0, self.env_steps / total))
                yield stats

    def make_stream(self):
        """The in-process stream, or the distributed one when the scheme asks for workers."""
        sc = self.cfg.scheme
        if sc.collectors <= 1 and sc.grad_workers <= 1:
            return self.stream()
        from corral.schemes import make_scheme

        return make_scheme(self).stream()

    def train(self) -> dict:
        """Run to ``cfg.steps`` (or the early stop); returns the summary printed by ``--json``."""
        cfg = self.cfg
        metrics = MetricsHook(self)
        hooks: list[Any] = [metrics]
        if self.run_dir is not None:
            hooks.append(CheckpointHook(self))
        evaluator = EvalHook(self, metrics)
        hooks.append(evaluator)
        if cfg.progress and not self.quiet:
            hooks.insert(0, ProgressHook(self))
        start = time.perf_counter() - self.train_seconds
        stopped_early = False
        updates = 0
        try:
            # Training time ends with the last update: stopping workers afterwards (a Ray
            # shutdown takes a second or two) is teardown, not training.
            for stats in self.make_stream():
                self.train_seconds = time.perf_counter() - start
                updates += 1
                for hook in hooks:
                    hook(self, stats)
                if (cfg.stop_at_return is not None and len(self.recent_returns) == self.recent_returns.maxlen
                        and self.last20_return >= cfg.stop_at_return):
                    stopped_early = True
                    break
                if (cfg.eval.stop_at_return is not None and evaluator.last_step == self.env_steps
                        and self.last_eval["mean_return"] >= cfg.eval.stop_at_return):
                    stopped_early = True  # the evaluation just made reached the bar
                    break
            if updates == 0:
                self.train_seconds = time.perf_counter() - start
        except BaseException:
            self.failed = True
            raise
        finally:
            # Hooks close in reverse so the final eval runs before the last checkpoint is written.
            for hook in reversed(hooks):
                try:
                    hook.close(self)
                except Exception:
                    if not self.failed:
                        raise
            self.env.close()
        summary = {
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "env_steps": self.env_steps,
            "train_seconds": round(self.train_seconds, 3),
            "episodes": self.episodes,
            "last20_return": self.last20_return if self.recent_returns else None,
            "stopped_early": stopped_early,
        }
        if self.last_eval:
            summary["eval_return"] = self.last_eval["mean_return"]
            summary["eval_return_std"] = self.last_eval["std_return"]
        return summary

    # --- state
    def state_dict(self) -> dict:
        state = {
            "config": C.to_dict(self.cfg),
            "algo": self.algo.state_dict(),
            "env": self.env.state_dict(),
            "obs": self.obs.cpu(),
            "rng": self.rng.state_dict(),
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "train_seconds": self.train_seconds,
                "best_eval": self.best_eval if math.isfinite(self.best_eval) else None,
                "next_eval": self.next_eval,
                "next_ckpt": self.next_ckpt,
                "recent_returns": list(self.recent_returns),
            },
            "torch_version": str(torch.__version__),
        }
        if self.collector_states is not None and any(self.collector_states):
            state["collectors"] = [s or {} for s in self.collector_states]
        return state

    def save(self, path: Path) -> Path:
        return save_checkpoint(self.state_dict(), path)

    def load_state_dict(self, state: dict) -> None:
        self.algo.load_state_dict(state["algo"])
        self.rng.load_state_dict(state["rng"])
        c = state["counters"]
        self.env_steps = int(c["env_steps"])
        self.episodes = int(c["episodes"])
        self.train_seconds = float(c["train_seconds"])
        self.best_eval = -math.inf if c["best_eval"] is None else float(c["best_eval"])
        self.next_eval, self.next_ckpt = c["next_eval"], c["next_ckpt"]
        self.recent_returns = deque(c["recent_returns"], maxlen=20)
        env_state, obs = state["env"], state["obs"]
        collectors = state.get("collectors")
        if collectors:
            if self.cfg.scheme.collectors > 1:
                self.resumed_collectors = collectors  # the scheme hands them out, one per collector
            if collectors[0].get("env") is not None and collectors[0]["obs"].shape == self.obs.shape:
                # in-process (or another collector count): collector 0's episodes go on here
                env_state, obs = collectors[0]["env"], collectors[0]["obs"]
        if self.env.load_state_dict(env_state):
            self.obs = obs.to(self.device)
        else:
            print(f"note: env {self.cfg.env.id!r} cannot be copied into a checkpoint; "
                  "the resumed run starts fresh episodes", file=sys.stderr)
            self.obs = self.env.reset(seed=self.rng.env_seed() + self.env_steps)
