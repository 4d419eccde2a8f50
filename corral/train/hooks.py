"""What consumes the Learner's stream: metrics (JSONL + TensorBoard), evaluation, checkpoints
and the progress bar. Each hook is called with the learner after every update event and
closed at the end (in reverse order, so the final evaluation precedes the last checkpoint)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from corral.train.evaluate import eval_generator, evaluate_policy, resolve_protocol
from corral.train.setup import make_env

if TYPE_CHECKING:
    from corral.train.learner import Learner


class MetricsHook:
    """Writes metrics.jsonl (flat names) and TensorBoard scalars (grouped: ``learner/``,
    ``actor/<k>/``, ``scheme/``, ``train/``, ``eval/``; ``corral.train.loggers.board_tag``)
    every ``log_every`` env steps, and the same to MLflow / W&B when ``log.mlflow`` /
    ``log.wandb`` are on. Also owns the run's Monitor CSVs and terminal screenshots."""

    def __init__(self, learner: "Learner"):
        from corral.train import loggers

        lc = learner.cfg.log
        self.every = max(1, learner.cfg.log_every)
        self.next = learner.env_steps + self.every
        self.file = open(learner.run_dir / "metrics.jsonl", "a") if learner.run_dir else None
        self.tb = None
        self.extra: list = []  # MLflow, W&B
        self.monitor = None
        self.screens = None
        if learner.run_dir and learner.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(learner.run_dir / "tb"))
            if learner.env_steps == 0:
                self.tb.add_text("run/config", "```\n" + _config_yaml(learner.cfg) + "```", 0)
                if lc.tag:
                    self.tb.add_text("run/tag", lc.tag, 0)
        if learner.run_dir:
            try:
                if lc.mlflow:
                    self.extra.append(loggers.MLflowLogger(learner))
                if lc.wandb:
                    self.extra.append(loggers.WandbLogger(learner))
                if lc.screenshot_every > 0:
                    self.screens = loggers.TerminalScreenshots(learner, lc.screenshot_every)
            except BaseException:
                self.close_writers(failed=True)
                raise
        monitor_dir = lc.monitor_dir or (learner.run_dir / "monitor" if learner.run_dir else None)
        if lc.monitor_csv and monitor_dir is not None:
            self.monitor = loggers.MonitorCSV(Path(monitor_dir), str(learner.cfg.env.id))
            learner.episode_log = self.monitor.add
        self.board_tag = loggers.board_tag
        self.optimizer_lr = loggers.optimizer_lr
        self.last_steps, self.last_time = learner.env_steps, time.perf_counter()

    def write(self, learner: "Learner", record: dict) -> None:
        record = {"step": learner.env_steps, **record}
        learner.last_metrics.update(record)
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.tb or self.extra:
            scalars = {self.board_tag(k): float(v) for k, v in record.items()
                       if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
            if self.tb:
                for k, v in scalars.items():
                    self.tb.add_scalar(k, v, learner.env_steps)
            for logger in self.extra:
                logger.log(scalars, learner.env_steps)

    def write_screenshots(self, learner: "Learner") -> None:
        for episode, terminated, frame in self.screens.take():
            if self.tb is not None and frame.ndim == 3:
                self.tb.add_image("screenshots/terminal", frame, learner.env_steps, dataformats="HWC")
                self.tb.add_text("screenshots/terminal_info", f"episode {episode} of env 0, "
                                 f"{'terminated' if terminated else 'truncated'}", learner.env_steps)

    def __call__(self, learner: "Learner", stats: dict, final: bool = False) -> None:
        self.stats = stats
        if self.screens is not None:
            self.write_screenshots(learner)
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
            "updates": learner.updates,
        }
        if "lr" not in record:
            lr = self.optimizer_lr(learner.algo)
            if lr is not None:
                record["lr"] = lr
        if learner.new_returns:
            record["episode_return"] = sum(learner.new_returns) / len(learner.new_returns)
            record["episode_length"] = sum(learner.new_lengths) / len(learner.new_lengths)
            learner.new_returns.clear()
            learner.new_lengths.clear()
        if learner.recent_returns:
            record["last20_return"] = learner.last20_return
        self.write(learner, record)

    def close(self, learner: "Learner") -> None:
        # a paused run writes no closing row: the resumed run logs on its own schedule
        if learner.env_steps > self.last_steps and not learner.failed and not learner.paused:
            self(learner, getattr(self, "stats", {}), final=True)
        self.close_writers(learner.failed)

    def close_writers(self, failed: bool) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.tb:
            self.tb.close()
        if self.monitor is not None:
            self.monitor.close()
        for logger in self.extra:
            logger.close(failed)
        self.extra = []


def _config_yaml(cfg) -> str:
    from corral import config as C

    return C.dump_yaml(cfg)


class EvalHook:
    """Evaluation on separate envs every ``eval.every`` steps and at the end, under the run's
    protocol (``resolve_protocol``: the policy's mode, epsilon from the ``eval_action`` stream,
    the episode cap, the time budget); the best one is checkpointed as ``best.pt`` and the last
    written to ``eval.json``. ``progress`` (a :class:`ProgressHook`, set by the Learner) shows
    each evaluation's episodes as they finish."""

    def __init__(self, learner: "Learner", metrics: MetricsHook):
        ec = learner.cfg.eval
        self.every = ec.every
        self.next = learner.next_eval if learner.next_eval else (learner.env_steps + ec.every if ec.every > 0 else None)
        learner.next_eval = self.next  # in every checkpoint from the start: a resumed run keeps the schedule
        self.metrics = metrics
        self.env = None
        self.last_step = -1  # env steps at the last evaluation
        self.progress: ProgressHook | None = None
        self.protocol = resolve_protocol(learner.cfg, learner.algo, learner.env_spec)

    def evaluate(self, learner: "Learner") -> dict:
        ec = learner.cfg.eval
        t0 = time.perf_counter()
        if self.env is None:
            self.env = make_env(learner.cfg, learner.env_spec, learner.device, num_envs=ec.num_envs, evaluation=True)
        learner.algo.actor.eval()
        on_episode = None
        if self.progress is not None:
            self.progress.eval_start(ec.episodes)
            on_episode = self.progress.eval_episode
        try:
            result = evaluate_policy(learner.algo.policy(self.protocol.deterministic),
                                     self.env, ec.episodes, self.protocol, seed=learner.rng.env_seed("eval_env"),
                                     generator=eval_generator(learner.rng.seeds["eval_action"], learner.device),
                                     on_episode=on_episode)
        finally:
            learner.algo.actor.train()
            if self.progress is not None:
                self.progress.eval_done()
        result["step"] = learner.env_steps
        self.note_limits(learner, result)
        if ec.video and self.metrics.tb is not None:
            self.log_video(learner)
        self.metrics.write(learner, {"eval_return": result["mean_return"], "eval_return_std": result["std_return"],
                                     "eval_episodes": result["episodes"], "eval_seconds": result["seconds"]})
        learner.last_eval = result
        # training time up to this update without the evaluations (benchmarks: time to a return)
        learner.eval_history.append({"step": learner.env_steps, "eval_return": result["mean_return"],
                                     "train_seconds": round(learner.train_seconds - learner.eval_seconds, 4)})
        learner.eval_seconds += time.perf_counter() - t0
        self.last_step = learner.env_steps
        if result["mean_return"] >= learner.best_eval:  # a tie: the later, more trained policy
            learner.best_eval = result["mean_return"]
            if learner.run_dir:
                learner.save(learner.run_dir / "checkpoints" / "best.pt", replay=False)  # for acting, not resuming
        return result

    def note_limits(self, learner: Learner, result: dict) -> None:
        """Say so when the time budget ended an evaluation or episodes ran into the cap (a
        policy stuck in a game that waits for it runs every episode to the cap)."""
        notes = []
        if result["stopped"] == "max_seconds":
            notes.append(f"evaluation at step {learner.env_steps:,} stopped at eval.max_seconds="
                         f"{self.protocol.max_seconds:g}: {result['episodes']} of {result['episodes_requested']} "
                         "episodes finished, the result is theirs")
        # an env's own limit is no sign of trouble (CartPole's 500 steps is the best outcome)
        if result["episodes_at_cap"] and self.protocol.episode_cap != "env":
            notes.append(f"{result['episodes_at_cap']} of {result['episodes']} evaluation episodes reached the "
                         f"{result['protocol']['max_episode_steps']:,}-step cap (eval.max_episode_steps) after "
                         f"{result['seconds']:.0f} s")
        if not notes or learner.quiet:
            return
        for text in notes:
            if self.progress is not None:
                self.progress.progress.console.print(f"note: {text}")
            else:
                print(f"corral: note: {text}", file=sys.stderr)

    def log_video(self, learner: "Learner") -> None:
        """One deterministic episode (the first eval episode's seed) as ``eval/video`` in TensorBoard."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        from corral.envs.video import episode_gif

        cfg = learner.cfg
        learner.algo.actor.eval()
        try:
            gif, (h, w), _ = episode_gif(learner.algo.policy(True), learner.env_spec,
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
        if learner.cfg.eval.episodes > 0 and not learner.failed and not learner.paused:
            result = self.evaluate(learner)
            if learner.run_dir:
                (learner.run_dir / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
        if self.env is not None:
            self.env.close()


class CheckpointHook:
    def __init__(self, learner: "Learner"):
        ck = learner.cfg.checkpoint
        self.every = ck.every
        self.keep = ck.keep
        self.next = learner.next_ckpt or (learner.env_steps + ck.every if ck.every > 0 else None)
        learner.next_ckpt = self.next

    def __call__(self, learner: "Learner", stats: dict) -> None:
        if self.next is not None and learner.env_steps >= self.next and learner.algo.at_boundary:
            self.next = learner.env_steps + self.every
            learner.next_ckpt = self.next
            folder = learner.run_dir / "checkpoints"
            # step-*.pt are snapshots to act with and evaluate; latest.pt (what resume reads)
            # keeps the replay buffer when the run saves it (save_replay)
            learner.save(folder / f"step-{learner.env_steps:010d}.pt", replay=False)
            learner.save(folder / "latest.pt")
            for old in sorted(folder.glob("step-*.pt"))[: -self.keep or None]:
                old.unlink()

    def close(self, learner: "Learner") -> None:
        if not learner.failed and not learner.paused:  # a paused run wrote its checkpoint at the pause
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
        self.name = f"{learner.cfg.algo} {learner.cfg.env.id}"
        self.task = self.progress.add_task(self.name, total=learner.cfg.steps,
                                           completed=learner.env_steps, sps=0.0, ret="-")
        self.progress.start()
        self.t0, self.s0 = time.perf_counter(), learner.env_steps
        self.last = 0.0
        self.last_eval = ""

    def eval_start(self, total: int) -> None:
        self.last_eval = f"evaluating: 0/{total} episodes"
        self.progress.update(self.task, description=f"{self.name} | {self.last_eval}")

    def eval_episode(self, finished: int, total: int, mean: float, seconds: float) -> None:
        """An evaluation episode finished: its count, running mean and elapsed time on the bar."""
        self.last_eval = f"eval {finished}/{total} episodes, mean {mean:.1f}, {seconds:.0f} s"
        self.progress.update(self.task, description=f"{self.name} | {self.last_eval}")

    def eval_done(self) -> None:
        text = f" | last {self.last_eval}" if self.last_eval else ""
        self.progress.update(self.task, description=self.name + text)

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
