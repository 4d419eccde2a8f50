"""A hash of where a fixed training budget leaves each algorithm: the actor's parameters and
buffers (normalizer included), the run's counters and the last returns. A refactor that is
meant to keep semantics keeps these hashes; a change meant to move numbers shows here.

Runs through the public API only (``corral.train``), so the same script measures another
checkout of corral: ``PYTHONPATH=/path/to/other/checkout python benchmarks/state_hash.py``.

    python benchmarks/state_hash.py                 # every case
    python benchmarks/state_hash.py --only ppo dqn  # some of them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch

CASES = {
    # name: (algo, env, steps, overrides)
    "ppo": ("ppo", "CartPole-v1", 8192, {"eval.episodes": 0}),
    "ppo_minibatch": ("ppo", "CartPole-v1", 4096, {"eval.episodes": 0, "ppo.batch_size": 64}),
    "dqn": ("dqn", "CartPole-v1", 6000, {"eval.episodes": 0}),
    "sac": ("sac", "Pendulum-v1", 1500, {"eval.episodes": 0, "sac.learning_starts": 500}),
    "td3": ("td3", "Pendulum-v1", 1500, {"eval.episodes": 0, "td3.learning_starts": 500}),
    # the CartPole preset before its lr change (the hash compares code, not presets)
    "impala": ("impala", "CartPole-v1", 4096, {"eval.episodes": 0, "impala.lr": 5e-4,
                                               "impala.lr_schedule": "constant"}),
    # truncation on every episode (V(final_obs) bootstraps), reward and observation scaling
    "ppo_pendulum": ("ppo", "Pendulum-v1", 4096, {"eval.episodes": 0, "ppo.normalize_reward": True,
                                                  "ppo.normalize_obs": True, "env.num_envs": 4}),
    "ppo_native": ("ppo", "native:CartPole-v1", 8192, {"eval.episodes": 0, "env.num_envs": 16,
                                                      "ppo.n_steps": 16, "ppo.batch_size": 128}),
    # the families whose parts were rearranged (recurrent actor-critics, delayed actors, epsilon,
    # registry variants): small budgets, the code paths they share
    "ppo_lstm": ("ppo_lstm", "CartPole-v1", 2048, {"eval.episodes": 0, "ppo_lstm.n_steps": 128,
                                                   "ppo_lstm.batch_size": 128}),
    "impala_lstm": ("impala_lstm", "CartPole-v1", 2048, {"eval.episodes": 0}),
    "r2d2": ("r2d2", "CartPole-v1", 3000, {"eval.episodes": 0, "r2d2.learning_starts": 1000}),
    "qmix_rnn": ("qmix", "corral.envs.matrix_games:TwoStepGame", 3000, {"eval.episodes": 0,
                                                                        "qmix.recurrent": True}),
    "matd3": ("matd3", "tests/ma_envs.py:TargetsEnv", 1500, {"eval.episodes": 0}),
    "ddpg": ("ddpg", "Pendulum-v1", 1500, {"eval.episodes": 0, "ddpg.learning_starts": 500}),
    # the on-policy family's other members (bonus streams, policy-gradient losses, TRPO's step)
    "ppo_rnd": ("ppo_rnd", "MountainCar-v0", 12288, {"eval.episodes": 0}),  # three updates after the warm-up
    "ppo_icm": ("ppo_icm", "MountainCar-v0", 12288, {"eval.episodes": 0}),
    "a2c": ("a2c", "CartPole-v1", 4096, {"eval.episodes": 0}),
    "reinforce": ("reinforce", "CartPole-v1", 4096, {"eval.episodes": 0}),
    "trpo": ("trpo", "Pendulum-v1", 4096, {"eval.episodes": 0}),
    # Ape-X in-process (scheme.collectors=1): the exploration ladders in place of the base's options
    "apex_dqn": ("apex_dqn", "CartPole-v1", 3000, {"eval.episodes": 0, "scheme.collectors": 1}),
    "apex_td3": ("apex_td3", "Pendulum-v1", 1500, {"eval.episodes": 0, "scheme.collectors": 1,
                                                   "apex_td3.learning_starts": 500}),
    # the fast paths moved into corral/kernels/ (issue 36): QR-DQN's step without autograd and numpy
    # acting at its CartPole preset, C51's numpy acting, APPO's clipped surrogate on IMPALA's loop
    "qrdqn": ("qrdqn", "CartPole-v1", 4000, {"eval.episodes": 0}),
    "c51": ("c51", "CartPole-v1", 3000, {"eval.episodes": 0, "c51.learning_starts": 1000}),
    "appo": ("appo", "CartPole-v1", 4096, {"eval.episodes": 0}),
}


def state_hash(agent) -> str:
    h = hashlib.sha256()
    for key, t in sorted(agent.algo.actor.state_dict().items()):
        h.update(key.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    s = agent.summary
    h.update(json.dumps([s.get("env_steps"), s.get("episodes"), s.get("last20_return")]).encode())
    return h.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(CASES))
    p.add_argument("--dump", help="save each case's network parameters (every declared network) to DIR/<case>.pt")
    p.add_argument("--compare", help="report the largest parameter difference to DIR/<case>.pt")
    args = p.parse_args()
    import corral

    torch.set_num_threads(1)
    out = {}
    for name in args.only:
        algo, env, steps, overrides = CASES[name]
        agent = corral.train(algo, env, steps=steps, seed=0, save_run=False, **overrides)
        out[name] = {"hash": state_hash(agent), "episodes": agent.summary.get("episodes"),
                     "last20_return": agent.summary.get("last20_return")}
        # every declared network (an exploration bonus's predictor too), not only the hashed actor
        algo_ = agent.algo
        state = {f"{net}.{k}": v.detach().cpu().clone() for net in algo_.networks
                 if isinstance(getattr(algo_, net, None), torch.nn.Module)
                 for k, v in getattr(algo_, net).state_dict().items()}
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            torch.save(state, os.path.join(args.dump, f"{name}.pt"))
        if args.compare:
            other = torch.load(os.path.join(args.compare, f"{name}.pt"), weights_only=True)
            out[name]["max_abs_param_diff"] = max((state[k].double() - other[k].double()).abs().max().item()
                                                  for k in state if state[k].is_floating_point())
        print(name, json.dumps(out[name]), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
