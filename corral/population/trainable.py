"""A Ray Tune trainable around a stepped corral Learner (search and PBT both run it).

Each trial is an ordinary corral run directory (``config.yaml``, ``metrics.jsonl``, TensorBoard,
``checkpoints/``). One Tune iteration is ``steps_per_iteration`` env steps then a deterministic
evaluation (the run's ``eval.*`` protocol), reported as ``eval_return``. Tune's checkpoints are
corral's: the whole training state (weights, optimizer, normalizer, RNG streams, counters, env
state, and the replay buffer of an off-policy run). Restoring another trial's checkpoint (PBT's
exploit) loads that state under *this* trial's config (its explored hyper-parameters):
the algorithm is built from this config, and loading an optimizer's state keeps the
hyper-parameters (lr, eps, betas) this config built it with (``Algorithm.load_state_dict``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray import tune

from corral import config as C

CKPT = "corral.pt"


class CorralTrainable(tune.Trainable):
    """``config``: ``__corral__`` (algo, env, sets, seed, steps per iteration, iterations,
    eval episodes, runs root) plus the searched keys (``ppo.lr``, ...) as ``--set`` overrides."""

    def setup(self, config: dict) -> None:
        self.spec = dict(config["__corral__"])
        self.hparams = {k: v for k, v in config.items() if not k.startswith("__")}
        self.learner = self._build()
        self.started = False

    def _build(self):
        from corral.train.learner import Learner
        from corral.train.setup import build_config

        s = self.spec
        cfg = build_config(s["algo"], s["env"], seed=s["seed"], sets=list(s["sets"]), overrides=self.hparams,
                           steps=s["steps_per_iteration"] * s["iterations"])
        cfg.progress = False
        cfg.eval.every = 0
        cfg.eval.episodes = s["eval_episodes"]
        self.run_dir = Path(s["runs_root"]) / self.trial_id
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(C.dump_yaml(cfg))
        learner = Learner(cfg, self.run_dir, quiet=True)
        return learner

    def step(self) -> dict:
        lr = self.learner
        if not self.started:
            lr.start()
            self.started = True
        target = lr.env_steps + self.spec["steps_per_iteration"]
        while lr.env_steps < target and not lr.done():
            lr.step()
        ev = lr.evaluate()
        result = {"eval_return": ev["mean_return"], "eval_return_std": ev["std_return"], "env_steps": lr.env_steps,
                  "last20_return": lr.last20_return if lr.recent_returns else None,
                  **{f"hp/{k}": v for k, v in self.hparams.items()}}
        if lr.done() or lr.env_steps >= lr.cfg.steps:
            result["done"] = True
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        state = self.learner.state_dict()
        state["population"] = {"trial": self.trial_id, "hparams": dict(self.hparams)}
        from corral.train.checkpoint import save_checkpoint

        save_checkpoint(state, Path(checkpoint_dir) / CKPT)
        self.learner.save(self.run_dir / "checkpoints" / "latest.pt")  # the run directory resumes like any run
        return None  # Tune hands load_checkpoint this directory

    def load_checkpoint(self, checkpoint: Any) -> None:
        from corral.train.checkpoint import load_checkpoint

        path = Path(checkpoint if isinstance(checkpoint, (str, Path)) else checkpoint.path) / CKPT
        state = load_checkpoint(path)
        if self.started:  # a reused trainable: a fresh learner, then the state
            self.learner.close()
            self.learner = self._build()
            self.started = False
        self.learner.load_state_dict(state)
        source = state.get("population", {})
        if source.get("trial") not in (None, self.trial_id):
            with open(self.run_dir / "population.jsonl", "a") as f:
                f.write(json.dumps({"step": self.learner.env_steps, "exploited": source["trial"],
                                    "their_hparams": source.get("hparams"), "hparams": self.hparams}) + "\n")
        self.exploited_from = source.get("trial")

    def cleanup(self) -> None:
        lr = self.learner
        if not self.started:
            lr.env.close()
            return
        episodes = lr.cfg.eval.episodes
        if not (lr.done() or lr.env_steps >= lr.cfg.steps):
            lr.cfg.eval.episodes = 0  # paused (PBT, ASHA): no final evaluation, the last iteration's stands
        try:
            lr.close()
        finally:
            lr.cfg.eval.episodes = episodes
