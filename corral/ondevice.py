"""Fully on-device PPO for native (torch-batched) envs.

With ``native:`` envs the env is tensors on the same device as the network, so the
whole loop (collection, rollout storage, GAE, minibatch updates and episode
statistics) can stay there. This module runs that loop without host syncs: no numpy,
no ``.item()`` / ``.tolist()`` / ``.any()`` per step or per minibatch. The host reads
the device only every ``log_every`` updates, for logging and the finiteness check.

It reuses corral's pieces rather than a second copy of them: the ``PPO`` algorithm
object builds the actor, optimizer, rollout storage and reward normalizer exactly as
the Learner does, the math is ``corral.returns`` (``gae``, ``rollout_next_values``)
and the loss is PPO's. What differs from ``Learner`` + ``PPO.observe``/``update``:

* ``V(final_obs)`` for truncated steps is computed once per rollout, over a stored
  ``[T, N, obs]`` buffer of normalized final observations, instead of per step behind
  ``truncated.any()``.
* Running normalizers are folded with ``merge`` (no finiteness sync per step); the
  losses are checked for NaN at each log point instead.
* Update statistics stay tensors until a log point.
* ``target_kl`` early stopping would need a sync per minibatch and is refused.

The result is a regular corral PPO agent (``corral.agent.Agent``): ``save``,
``corral.load`` and ``corral.evaluate`` work on it as on any other.

The loop is eager. On CPU it is bound by per-op dispatch, and ``torch.compile`` of the
collection step took two minutes to compile (graph breaks at the sampling generator and the
env's sparse reset, a recompile per rollout index) for no faster steps afterwards, against a
training run of a few seconds (docs/native.md has the figures).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from corral import config as C
from corral.algos.ppo import PPO, STAT_NAMES, PPOConfig, ppo_schedules
from corral.errors import TrainingError, UserError
from corral.rng import RNGStreams

# Hyperparameters tuned for the on-device path: many envs, short rollouts, a few large
# minibatches. Keys are PPOConfig fields plus ``num_envs`` and ``steps``.
PRESETS: dict[str, dict[str, Any]] = {
    # rl-zoo's CartPole discounting (gamma 0.98, lambda 0.8) with 64 envs: deterministic eval
    # >= 475 on all of 8 seeds after 0.5-1.7 s of training on one CPU core (docs/native.md).
    # Later updates can lose it again, hence ``stop_at_eval``.
    "CartPole-v1": dict(num_envs=64, steps=300_000, n_steps=16, batch_size=512, n_epochs=10, lr=3e-3,
                        lr_schedule="linear", gamma=0.98, gae_lambda=0.8, clip_range=0.2,
                        clip_schedule="linear", ent_coef=0.0, hidden=(64, 64)),
    # Checked once (seed 0): native eval -204, Gymnasium eval -239 after 400k steps, 24 s.
    "Pendulum-v1": dict(num_envs=64, steps=400_000, n_steps=32, batch_size=1024, n_epochs=10, lr=1e-3,
                        gamma=0.9, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, normalize_reward=True),
}


class OnDevicePPO:
    """PPO on a native VecEnv with every tensor on ``env.device``.

    ``train(steps)`` may be called repeatedly to continue; ``train_seconds`` counts only
    time inside the loop (not the callback's).
    """

    def __init__(self, env, cfg: PPOConfig, seed: int = 0, actor: torch.nn.Module | None = None):
        if cfg.target_kl is not None:
            raise UserError("ppo.target_kl needs a host sync per minibatch; the on-device path does not support it")
        self.env = env
        self.cfg = cfg
        self.device = env.device
        self.rng = RNGStreams(seed, self.device)
        T, N = cfg.n_steps, env.num_envs
        # The PPO object builds actor, optimizer, storage and normalizers as the Learner's would;
        # a problem-specific actor (e.g. the MaxCut node policy, with ActorCritic's interface:
        # forward(x) -> (dist params, value), head, normalize, to_env, evaluate_actions, value,
        # stored_obs(), stored_action()) comes in through PPO's ``make_actor`` factory.
        cls = PPO if actor is None else _with_actor(actor)
        if actor is not None:  # a problem's preset may ask for more than one rollout: one minibatch then
            cfg = replace(cfg, batch_size=min(cfg.batch_size, T * N))
            self.cfg = cfg
        self.algo = cls(cfg, env.single_observation_space, env.single_action_space, N, self.device, self.rng)
        self.actor, self.optimizer, self.storage = self.algo.actor, self.algo.optimizer, self.algo.storage
        self.ret_norm, self._disc_return = self.algo.ret_norm, self.algo._disc_return
        self.final_x = torch.zeros_like(self.storage.data.obs)  # normalized final obs, for V on truncation
        self.obs = env.reset(seed=self.rng.env_seed())
        self.env_steps = 0
        self.updates = 0
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0  # process CPU time: steadier than wall time on a shared machine
        # Episode statistics since the last log point, on device.
        self._ep_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self._ep_count = torch.zeros((), dtype=torch.int64, device=self.device)
        self._stat_sum = torch.zeros(len(STAT_NAMES), device=self.device)
        self._stat_count = 0
        self.episodes = 0
        self.history: list[dict] = []
        self._rollout = T * N
        # made once: a fresh host scalar per step would be a host-to-device copy per step
        self._batch_count = torch.tensor(float(N), dtype=torch.float64, device=self.device)

    # ------------------------------------------------------------------ collection
    @torch.no_grad()
    def _normalize(self, obs: torch.Tensor) -> torch.Tensor:
        norm = getattr(self.actor, "obs_norm", None)
        if norm is not None and norm.enabled and norm.training:
            x = obs.reshape(-1, *norm.mean.shape).to(torch.float64)
            norm.merge(self._batch_count, x.mean(0), x.var(0, unbiased=False))
        return self.actor.normalize(obs)

    @torch.no_grad()
    def _scale_reward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        disc, norm = self._disc_return, self.ret_norm
        disc.mul_(self.cfg.gamma).add_(reward)
        d = disc.to(torch.float64)
        norm.merge(self._batch_count, d.mean(), d.var(unbiased=False))
        disc.masked_fill_(done, 0.0)
        std = (norm.var + norm.eps).sqrt().float()
        return (reward / std).clamp(-self.cfg.reward_clip, self.cfg.reward_clip)

    @torch.no_grad()
    def _collect_step(self, t: int, obs: torch.Tensor) -> torch.Tensor:
        actor, d = self.actor, self.storage.data
        x = self._normalize(obs)
        params, value = actor(x)
        action = actor.head.sample(params, self.rng["action"])
        d.obs[t].copy_(x)
        d.actions[t].copy_(action)
        d.log_probs[t].copy_(actor.head.log_prob(params, action))
        d.values[t].copy_(value)
        next_obs, reward, terminated, truncated, info = self.env.step(actor.to_env(action))
        done = terminated | truncated
        if self.cfg.normalize_reward:
            reward = self._scale_reward(reward, done)
        d.rewards[t].copy_(reward)
        d.terminated[t].copy_(terminated)
        d.truncated[t].copy_(truncated)
        self.final_x[t].copy_(actor.normalize(info["final_obs"]))
        self._ep_sum += torch.where(done, info["episode_return"].to(torch.float64), 0.0).sum()
        self._ep_count += done.sum()
        return next_obs

    def collect(self) -> None:
        obs = self.obs
        for t in range(self.cfg.n_steps):
            obs = self._collect_step(t, obs)
        self.obs = obs
        self.env_steps += self._rollout

    # ------------------------------------------------------------------ learning
    def update(self, progress: float) -> None:
        """PPO's own minibatch loop (``PPO.train_minibatches``) on the rollout, with ``V(final_obs)``
        computed in one batched forward and the statistics kept on the device until ``log``."""
        algo, actor = self.algo, self.actor
        _, clip = ppo_schedules(self.cfg, self.optimizer, progress)
        data = self.storage.data
        T, N = data.rewards.shape
        with torch.no_grad():
            final_v = actor.value(self.final_x.flatten(0, 1)).view(T, N)
            data.final_values.copy_(torch.where(data.truncated, final_v, 0.0))
        algo._last_obs = self.obs
        sums, evaluated, _, _ = algo.train_minibatches(algo.prepare_batch(), clip)  # no host read (no target_kl)
        self._stat_sum += sums
        self._stat_count += evaluated
        self.storage.clear()
        self.updates += 1
        algo.updates = self.updates

    # ------------------------------------------------------------------ the loop
    def log(self) -> dict:
        """Sync with the device once: update stats and episodes since the last call."""
        stats = (self._stat_sum / max(self._stat_count, 1)).tolist()
        ep_sum, ep_count = float(self._ep_sum), int(self._ep_count)
        self._stat_sum.zero_()
        self._stat_count = 0
        self._ep_sum.zero_()
        self._ep_count.zero_()
        self.episodes += ep_count
        record = {"step": self.env_steps, "updates": self.updates, "time": round(self.train_seconds, 4),
                  "episodes": self.episodes, **dict(zip(STAT_NAMES, stats))}
        if ep_count:
            record["episode_return"] = ep_sum / ep_count
        if not all(math.isfinite(v) for v in stats[:3]):
            raise TrainingError(
                f"PPO loss became non-finite by update {self.updates} ({record}); lower ppo.lr or enable "
                "ppo.normalize_obs / normalize_reward"
            )
        self.history.append(record)
        return record

    def train(self, steps: int, log_every: int = 10,
              callback: Callable[["OnDevicePPO", dict], bool | None] | None = None) -> dict:
        """Train until ``steps`` total env steps; every ``log_every`` updates sync once, log, and
        call ``callback(self, record)`` (excluded from ``train_seconds``; True stops)."""
        self.actor.train()
        total = int(steps)
        while self.env_steps < total:
            t0, c0 = time.perf_counter(), time.process_time()
            self.collect()
            self.update(min(1.0, self.env_steps / total))
            last = self.env_steps >= total
            if self.updates % log_every == 0 or last:
                record = self.log()  # the sync point: timing includes the device work
                self.train_seconds += time.perf_counter() - t0
                self.train_cpu_seconds += time.process_time() - c0
                record["time"] = round(self.train_seconds, 4)
                record["cpu_time"] = round(self.train_cpu_seconds, 4)
                if callback is not None and callback(self, record):
                    break
            else:
                self.train_seconds += time.perf_counter() - t0
                self.train_cpu_seconds += time.process_time() - c0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.summary()

    def summary(self) -> dict:
        last = next((r["episode_return"] for r in reversed(self.history) if "episode_return" in r), None)
        return {"env_id": self.env.env_id, "device": str(self.device), "num_envs": self.env.num_envs,
                "env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
                "train_seconds": round(self.train_seconds, 3), "train_cpu_seconds": round(self.train_cpu_seconds, 3),
                "steps_per_second": round(self.env_steps / max(self.train_seconds, 1e-9)),
                "episode_return": last}

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "optimizer": self.optimizer.state_dict(),
                "ret_norm": self.ret_norm.state_dict(), "disc_return": self._disc_return.clone(),
                "env": self.env.state_dict(), "rng": self.rng.state_dict(), "obs": self.obs.clone(),
                "env_steps": self.env_steps, "updates": self.updates}


def _with_actor(actor: torch.nn.Module) -> type[PPO]:
    """PPO whose actor factory returns ``actor``."""

    class GivenActorPPO(PPO):
        def make_actor(self):
            return actor

    return GivenActorPPO


@torch.no_grad()
def evaluate_native(actor, env_id: str, episodes: int = 50, seed: int = 0, device=None) -> torch.Tensor:
    """Deterministic returns of ``episodes`` episodes on a native env, one per env copy.

    Runs on the actor's device with no host sync until the caller reads the result
    (a float64 tensor ``[episodes]``).
    """
    from corral.envs.native import make_native

    device = device or next(actor.parameters()).device
    env = make_native(env_id, episodes, device=device, seed=seed)
    obs = env.reset(seed=seed)
    returns = torch.zeros(episodes, dtype=torch.float64, device=device)
    alive = torch.ones(episodes, dtype=torch.bool, device=device)
    was_training = actor.training
    actor.eval()
    try:
        for _ in range(env.max_episode_steps):
            obs, reward, terminated, truncated, _ = env.step(actor.act(obs, deterministic=True))
            returns += reward * alive
            alive &= ~(terminated | truncated)
    finally:
        actor.train(was_training)
    return returns


def ondevice_config(env_id: str, steps: int | None = None, num_envs: int | None = None,
                    **ppo_overrides) -> tuple[PPOConfig, int, int]:
    """The on-device preset for ``env_id`` with overrides: ``(PPOConfig, num_envs, steps)``."""
    preset = dict(PRESETS.get(env_id.removeprefix("native:"), {}))
    n = int(num_envs or preset.pop("num_envs", 64))
    preset.pop("num_envs", None)
    total = int(steps or preset.pop("steps", 100_000))
    preset.pop("steps", None)
    preset.update(ppo_overrides)
    fields = set(PPOConfig.__dataclass_fields__)
    unknown = sorted(set(preset) - fields)
    if unknown:
        raise UserError(f"unknown PPO option(s) {', '.join(unknown)}; see `corral list --options ppo`")
    cfg = PPOConfig()
    C.update_from_dict(cfg, preset, "ppo.")  # the types, choices and ranges every run's config gets
    return cfg, n, total


def train_ondevice(algo: str = "ppo", env_id: str = "native:CartPole-v1", num_envs: int | None = None,
                   steps: int | None = None, seed: int = 0, device: str = "auto", log_every: int = 2,
                   eval_episodes: int = 0, stop_at_eval: float | None = None, eval_seed: int = 12345,
                   callback=None, **ppo_overrides) -> dict:
    """Train PPO on a native env with everything on ``device``.

    Every ``log_every`` updates the host syncs once; there, with ``eval_episodes > 0``, the
    deterministic policy plays that many episodes on a separate native env (not counted in
    ``train_seconds``), and ``stop_at_eval`` ends training at the first mean return at or
    above it. ``callback(trainer, record)`` runs after that and may return True to stop.

    Returns ``{"summary", "actor", "agent", "trainer"}``; the agent evaluates, saves and
    loads like any corral agent.
    """
    from corral.agent import Agent
    from corral.envs.native import make_native
    from corral.train.setup import resolve_device

    if algo != "ppo":
        raise UserError(f"the on-device path supports algo 'ppo' only, got {algo!r}")
    if not env_id.startswith("native:"):
        env_id = "native:" + env_id
    if stop_at_eval is not None and eval_episodes <= 0:
        eval_episodes = 50
    dev = resolve_device(device)
    cfg, n, total = ondevice_config(env_id, steps, num_envs, **ppo_overrides)
    env = make_native(env_id, n, device=dev)
    trainer = OnDevicePPO(env, cfg, seed=seed)
    evals: list[dict] = []
    reached: list[dict] = []

    def hook(tr: OnDevicePPO, record: dict) -> bool:
        if eval_episodes > 0:
            ret = evaluate_native(tr.actor, env_id, eval_episodes, eval_seed)
            record["eval_return"] = float(ret.mean())
            evals.append({"step": record["step"], "time": record["time"], "cpu_time": record["cpu_time"],
                          "eval_return": record["eval_return"]})
            if stop_at_eval is not None and record["eval_return"] >= stop_at_eval:
                reached.append(evals[-1])
                return True
        return bool(callback(tr, record)) if callback is not None else False

    summary = trainer.train(total, log_every=log_every, callback=hook)
    if evals:
        summary["eval_return"] = evals[-1]["eval_return"]
        summary["evals"] = evals
    if stop_at_eval is not None:
        summary["reached_eval"] = bool(reached)
        summary["seconds_to_eval"] = reached[0]["time"] if reached else None
        summary["cpu_seconds_to_eval"] = reached[0]["cpu_time"] if reached else None
    tcfg = C.TrainConfig(algo="ppo", algo_cfg=cfg, steps=total, seed=seed, device=str(dev))
    tcfg.env.id, tcfg.env.num_envs, tcfg.env.backend = env_id, n, "native"
    agent = Agent(trainer.algo, tcfg, summary=summary)
    return {"summary": summary, "actor": trainer.actor, "agent": agent, "trainer": trainer}
