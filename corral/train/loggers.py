"""What the metrics hook writes besides ``metrics.jsonl`` (docs/logging.md).

* ``board_tag``: a metric's name in TensorBoard, MLflow and W&B, grouped as Deep RL Zoo's
  users read them: ``learner/...`` (the algorithm's update statistics, its lr, the update
  count), ``actor/<k>/...`` (each Ray collector's step rate, episodes, fragments),
  ``scheme/...`` (policy lag, restarts, waits), ``train/...`` (the run's episode returns,
  step rate) and ``eval/...``. ``metrics.jsonl`` keeps the flat names.
* ``MonitorCSV``: one Stable-Baselines3 Monitor-style CSV per env (``log.monitor_csv``).
* ``TerminalScreenshots``: a rendered frame of env 0's terminal state every K episodes, as
  TensorBoard images (``log.screenshot_every``).
* ``MLflowLogger``, ``WandbLogger``: the same metrics, under the same names (``log.mlflow``,
  ``log.wandb``).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from corral.errors import UserError

if TYPE_CHECKING:
    from corral.train.learner import Learner

# Written by the metrics hook itself (the run's view), not by the algorithm.
RUN_KEYS = {"episodes", "steps_per_second", "time", "episode_return", "episode_length", "last20_return"}
# Written by a distributed scheme (corral/schemes/fragments.py, grad.py).
SCHEME_KEYS = {"policy_lag", "policy_lag_max", "fragments", "collector_restarts", "dropped_fragments",
               "learner_wait_seconds", "param_bytes", "grad_lag", "grad_lag_max",
               "replay_restarts", "replay_lost_transitions", "replay_lost_updates", "grad_worker_restarts"}
_COLLECTOR = re.compile(r"collector(\d+)_(\w+)")
_ACTOR_NAMES = {"sps": "steps_per_s"}


def board_tag(key: str) -> str:
    """``metrics.jsonl``'s flat name -> the grouped name in TensorBoard / MLflow / W&B."""
    m = _COLLECTOR.fullmatch(key)
    if m:
        return f"actor/{m.group(1)}/{_ACTOR_NAMES.get(m.group(2), m.group(2))}"
    if key in RUN_KEYS:
        return f"train/{key}"
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    if key in SCHEME_KEYS:
        return f"scheme/{key}"
    return f"learner/{key}"


def optimizer_lr(algo) -> float | None:
    """The learning rate of the algorithm's first optimizer (for ``learner/lr`` where the
    algorithm's statistics do not report one)."""
    opts = algo.declared_optimizers()
    if not opts:
        return None
    opt = opts[0]
    groups = getattr(opt, "param_groups", None)
    if groups:
        return float(groups[0]["lr"])
    lr = getattr(opt, "lr", None)
    return float(lr) if isinstance(lr, (int, float)) else None


def check_log_config(learner: Learner) -> None:
    """The ``log.*`` options that can fail, checked when the Learner is built: before the
    CLI makes a run directory, so bad input leaves none."""
    lc = learner.cfg.log
    if lc.screenshot_every > 0:
        TerminalScreenshots.check(learner)
    for on, module, extra in ((lc.mlflow, "mlflow", "mlflow"), (lc.wandb, "wandb", "wandb")):
        if on:
            try:
                __import__(module)
            except ImportError:
                raise UserError(f"log.{extra}=true needs {module}: pip install 'corral[{extra}]'") from None


class MonitorCSV:
    """``<folder>/<i>.monitor.csv`` (``log.monitor_dir``, default ``<run_dir>/monitor``) per env ``i`` (in-process) or per collector
    ``c<k>`` (Ray): SB3's Monitor format, a ``#{"t_start": ..., "env_id": ...}`` line, then
    ``r,l,t`` rows (return, length, seconds since the run's start). Appends on resume."""

    def __init__(self, folder: Path, env_id: str):
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env_id = env_id
        self.t0 = time.time()
        self.files: dict[str, Any] = {}

    def _file(self, name: str):
        f = self.files.get(name)
        if f is None:
            path = self.dir / f"{name}.monitor.csv"
            new = not path.exists()
            f = self.files[name] = open(path, "a")  # noqa: SIM115 - open for the run, closed in close()
            if new:
                f.write("#" + json.dumps({"t_start": self.t0, "env_id": self.env_id}) + "\n")
                f.write("r,l,t\n")
        return f

    def add(self, name: str, returns, lengths) -> None:
        f = self._file(name)
        t = round(time.time() - self.t0, 6)
        for r, n in zip(returns, lengths):
            f.write(f"{float(r):.6g},{int(n)},{t}\n")
        f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


class _TerminalShot(gym.Wrapper):
    """Renders the state an episode ended in, every ``every``-th episode of this env."""

    def __init__(self, env: gym.Env, every: int):
        super().__init__(env)
        self.every, self.episodes, self.frames = every, 0, []

    def step(self, action):
        out = self.env.step(action)
        if out[2] or out[3]:
            self.episodes += 1
            if self.episodes % self.every == 0:
                frame = self.env.render()
                if frame is not None:
                    self.frames.append((self.episodes, bool(out[2]), np.asarray(frame)))
        return out


class TerminalScreenshots:
    """``log.screenshot_every=K``: env 0's terminal state every K of its episodes, as the
    TensorBoard image ``screenshots/terminal`` (step = env steps when it was logged). Runs
    in-process with the ``sync`` backend (the env must be in this process to render)."""

    def __init__(self, learner: Learner, every: int):
        self.check(learner)
        group = learner.env.group
        self.shot = group.envs[0] = _TerminalShot(group.envs[0], every)

    @staticmethod
    def check(learner: Learner) -> None:
        cfg = learner.cfg
        if cfg.scheme.collectors > 1 or cfg.env.backend != "sync":
            raise UserError("log.screenshot_every renders env 0 in the learner's process: it needs env.backend=sync "
                            f"and scheme.collectors=1 (this run has env.backend={cfg.env.backend}, "
                            f"scheme.collectors={cfg.scheme.collectors})")
        group = learner.env.group
        env = group.envs[0]
        mode = getattr(env, "render_mode", None)
        if mode != "rgb_array":
            raise UserError(f"log.screenshot_every needs env 0 to render rgb_array frames; {cfg.env.id!r} has "
                            f"render_mode={mode!r}: pass env.kwargs.render_mode=rgb_array (corral does for "
                            "Gymnasium ids) or an env that renders")

    def take(self) -> list[tuple[int, bool, np.ndarray]]:
        frames, self.shot.frames = self.shot.frames, []
        return frames


class MLflowLogger:
    """The metrics to MLflow under the TensorBoard names: a run named after the run
    directory, its config as parameters, ``log.tag`` as a tag. Default store: a local file
    store ``<runs root>/mlruns`` (``mlflow ui --backend-store-uri`` it)."""

    def __init__(self, learner: Learner):
        try:
            import mlflow  # noqa: F401
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UserError("log.mlflow needs MLflow: pip install 'corral[mlflow]'") from None
        run_dir = learner.run_dir
        uri = learner.cfg.log.mlflow_uri or (run_dir.resolve().parent / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3.x refuses its file store unless asked for it (it prefers a database):
            # a local file store is what log.mlflow promises; sqlite:///mlflow.db is the other choice
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name("corral")
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment("corral")
        tags = {"mlflow.runName": run_dir.name, "corral.run_dir": str(run_dir)}
        if learner.cfg.log.tag:
            tags["corral.tag"] = learner.cfg.log.tag
        self.run_id = self.client.create_run(exp_id, tags=tags).info.run_id
        from mlflow.entities import Param

        from corral import config as C

        flat = _flatten(C.to_dict(learner.cfg))
        params = [Param(k, str(v)[:500]) for k, v in flat.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ts, step) for k, v in metrics.items()])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class WandbLogger:
    """The metrics to Weights & Biases under the TensorBoard names; offline by default (files
    under ``<run_dir>/wandb``, uploaded later with ``wandb sync``)."""

    def __init__(self, learner: Learner):
        try:
            import wandb
        except ImportError:
            raise UserError("log.wandb needs Weights & Biases: pip install 'corral[wandb]'") from None
        from corral import config as C

        lc = learner.cfg.log
        self.wandb = wandb
        self.run = wandb.init(project=lc.wandb_project, name=learner.run_dir.name, dir=str(learner.run_dir),
                              mode=lc.wandb_mode, config=C.to_dict(learner.cfg),
                              tags=[lc.tag] if lc.tag else None, reinit="finish_previous")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out
