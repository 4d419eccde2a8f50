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


def summarize(returns: list[float]) -> dict:
    arr = np.asarray(returns, dtype=np.float64)
    return {
        "mean_return": float(arr.mean()) if arr.size else float("nan"),
        "std_return": float(arr.std()) if arr.size else float("nan"),
        "episodes": int(arr.size),
    }
