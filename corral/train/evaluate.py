"""Evaluation: run a policy on separate envs and report raw env returns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from corral.envs.base import episode_done


def run_episodes(
    act: Callable[[torch.Tensor], torch.Tensor],
    env,
    episodes: int,
    seed: int | None = None,
    max_steps: int = 1_000_000,
) -> list[float]:
    """Play until ``episodes`` episodes finished, spread evenly over the env's N copies
    (the first ones of each env, so the result does not favour short episodes)."""
    n = env.num_envs
    targets = np.array([(episodes + i) // n for i in range(n)])
    if getattr(env, "device_resident", False) and episodes <= n:
        return _first_episodes_on_device(act, env, torch.as_tensor(targets > 0, device=env.device), seed)
    counts = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    obs = env.reset(seed=seed)
    for _ in range(max_steps):
        if (counts >= targets).all():
            break
        obs, _, term, trunc, info = env.step(act(obs))
        done = episode_done(info, term, trunc).cpu().numpy()
        if done.any():
            ep_ret = info["episode_return"].cpu().numpy()
            for i in np.nonzero(done)[0]:
                if counts[i] < targets[i]:
                    returns.append(float(ep_ret[i]))
                    counts[i] += 1
    return returns


@torch.no_grad()
def _first_episodes_on_device(act, env, wanted: torch.Tensor, seed: int | None, check_every: int = 64) -> list[float]:
    """The first episode of each ``wanted`` env copy of a device-resident env, stepped with no
    host read but one every ``check_every`` steps (are any still running?)."""
    obs = env.reset(seed=seed)
    alive = wanted.clone()
    returns = torch.zeros(env.num_envs, device=env.device)
    t = 0
    while True:
        obs, _, term, trunc, info = env.step(act(obs))
        done = episode_done(info, term, trunc) & alive
        returns = torch.where(done, info["episode_return"].to(returns.dtype), returns)
        alive &= ~done
        t += 1
        if t % check_every == 0 and not bool(alive.any()):
            break
    return returns[wanted].tolist()


@torch.no_grad()
def evaluate_native(actor, env_id: str, episodes: int = 50, seed: int = 0, device=None) -> torch.Tensor:
    """Deterministic returns (float64 ``[episodes]``) of one episode per copy of a native env,
    on the actor's device."""
    from corral.envs.native import make_native

    device = device or next(actor.parameters()).device
    env = make_native(env_id, episodes, device=device, seed=seed)
    was_training = actor.training
    actor.eval()
    try:
        returns = _first_episodes_on_device(lambda o: actor.act(o, deterministic=True), env,
                                            torch.ones(episodes, dtype=torch.bool, device=device), seed)
    finally:
        actor.train(was_training)
    return torch.tensor(returns, dtype=torch.float64, device=device)


def summarize(returns: list[float]) -> dict:
    arr = np.asarray(returns, dtype=np.float64)
    return {
        "mean_return": float(arr.mean()) if arr.size else float("nan"),
        "std_return": float(arr.std()) if arr.size else float("nan"),
        "episodes": int(arr.size),
    }
