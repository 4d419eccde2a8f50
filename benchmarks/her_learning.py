"""HER against no HER at the same budget: success rate on held-out episodes of a goal env.

    python benchmarks/her_learning.py sac PointReach-v0 --steps 6000 --seeds 0 1 2
    python benchmarks/her_learning.py dqn BitFlipping15-v0 --steps 10000 --seeds 0

Each seed trains twice with the same config (the algorithm's preset for the env, then
``--set`` pairs), once with ``replay=her`` and once with ``replay`` unset (uniform replay);
every ``--every`` env steps the policy's success rate on ``--episodes`` held-out episodes
(mode actions, env seed 123) is recorded, and a JSON line per run is printed at the end. Success is the last step's reward being 0
(the goal reached: BitFlipping terminates there, PointReach ends within the threshold).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def success_rate(algo, env_id: str, episodes: int = 100, seed: int = 123, kwargs: dict | None = None) -> float:
    """The fraction of ``episodes`` held-out episodes (one per env copy, mode actions) whose last
    step has reward 0."""
    from corral.envs import make_vec_env

    env = make_vec_env(env_id, episodes, kwargs=kwargs)
    try:
        obs = env.reset(seed=seed)
        done = torch.zeros(episodes, dtype=torch.bool)
        success = torch.zeros(episodes, dtype=torch.bool)
        with torch.no_grad():
            while not bool(done.all()):
                obs, reward, terminated, truncated, _ = env.step(algo.act(obs, deterministic=True))
                ended = (terminated | truncated).cpu() & ~done
                success |= ended & (reward.cpu() == 0)
                done |= ended
        return float(success.float().mean())
    finally:
        env.close()


class SuccessCurve:
    """A Learner hook: the held-out success rate every ``every`` env steps."""

    def __init__(self, env_id: str, every: int, episodes: int, kwargs: dict | None = None):
        self.env_id, self.every, self.episodes, self.kwargs = env_id, every, episodes, kwargs
        self.points: list[tuple[int, float]] = []
        self._next = every

    def __call__(self, learner, stats) -> None:
        if learner.env_steps >= self._next:
            self._next += self.every
            self.points.append((learner.env_steps, success_rate(learner.algo, self.env_id, self.episodes,
                                                                kwargs=self.kwargs)))

    def close(self, learner) -> None:
        pass


def run(algo: str, env_id: str, steps: int, seed: int, her: bool, every: int, episodes: int, sets: dict) -> dict:
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    # replay named either way: the env's preset may set replay=her (PointReach-v0, BitFlipping*-v0)
    overrides = {"eval.episodes": 0, "tensorboard": False, **sets, "replay": "her" if her else None}
    t0 = time.time()
    cfg = build_config(algo, env_id, steps=steps, seed=seed, overrides=overrides)
    learner = Learner(cfg, None, env_spec=env_id, quiet=True)
    curve = SuccessCurve(env_id, every, episodes, cfg.env.kwargs or None)
    learner.train(hooks=[curve] if every < steps else [])
    final = success_rate(learner.algo, env_id, episodes, kwargs=cfg.env.kwargs or None)
    return {"algo": algo, "env": env_id, "her": her, "seed": seed, "steps": steps, "success": final,
            "curve": curve.points, "seconds": round(time.time() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("algo")
    p.add_argument("env")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--seeds", type=int, nargs="*", default=[0])
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--every", type=int, default=0, help="also evaluate every this many env steps (0: only at the end)")
    p.add_argument("--set", action="append", default=[], help="key=value (YAML value), as corral train --set")
    p.add_argument("--only", choices=["her", "plain"], help="run one arm only")
    args = p.parse_args()
    import yaml

    torch.set_num_threads(1)
    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    for seed in args.seeds:
        for her in (True, False):
            if args.only and args.only != ("her" if her else "plain"):
                continue
            out = run(args.algo, args.env, args.steps, seed, her, args.every or args.steps, args.episodes, sets)
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
