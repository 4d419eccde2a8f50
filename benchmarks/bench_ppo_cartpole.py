"""Time to a last-20 training return of 475 on CartPole-v1: corral PPO vs Stable-Baselines3 PPO.

Three runs per seed, alternating in one process so all see the same machine load:

* corral: what ``corral train ppo CartPole-v1`` does (its preset: rl-zoo's values but 10
  epochs at lr 3e-3 instead of 20 at 1e-3);
* corral-zoo: corral at exactly rl-baselines3-zoo's tuned CartPole hyperparameters (8 envs,
  n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 and clip 0.2,
  tanh 64x64 separate policy and value nets): the framework-for-framework comparison;
* SB3 at those rl-zoo values.

Same Gymnasium env, same seeds, one torch thread each. Time is training time from the
first env step (imports and construction excluded), checked after every update for corral and
after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3
    python benchmarks/bench_ppo_cartpole.py --seeds 0 1 2 3 4 5 6 7
"""

from __future__ import annotations

from bench_common import learn_sb3, main, run_corral

TARGET = 475.0
BUDGET = 100_000

# rl-zoo's values where corral's CartPole preset differs (it trains 10 epochs at lr 3e-3)
ZOO = ("ppo.n_epochs=20", "ppo.lr=0.001")


def sb3_zoo_kwargs() -> dict:
    """rl-zoo's ppo.yml CartPole-v1 entry as SB3 (and SBX) keyword arguments (its 8 envs apart)."""

    def lin(v):
        return lambda progress: progress * v

    return dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=lin(1e-3), clip_range=lin(0.2))


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **sb3_zoo_kwargs())
    return learn_sb3(model, BUDGET, TARGET)


if __name__ == "__main__":
    main({"corral": lambda s: run_corral("ppo", "CartPole-v1", BUDGET, s, TARGET),
          "corral-zoo": lambda s: run_corral("ppo", "CartPole-v1", BUDGET, s, TARGET, ZOO),
          "sb3": run_sb3}, "sb3", TARGET, default_seeds=range(8))
