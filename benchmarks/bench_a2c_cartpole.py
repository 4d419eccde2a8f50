"""Time to a last-20 training return of 475 on CartPole-v1: corral A2C vs Stable-Baselines3 A2C.

Both at rl-baselines3-zoo's CartPole values (``a2c.yml``: 8 envs, ``ent_coef`` 0, SB3's A2C
defaults otherwise: n_steps 5, lr 7e-4, RMSprop alpha 0.99 eps 1e-5, gae_lambda 1.0,
vf_coef 0.5, max_grad_norm 0.5, tanh 64x64 separate policy and value nets), which is what
``corral train a2c CartPole-v1`` runs. Runs alternate per seed in one process so both see
the same machine load; same Gymnasium env, same seeds, one torch thread each. Time is
training time from the first env step (imports and construction excluded), checked after
every update for corral and after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3
    python benchmarks/bench_a2c_cartpole.py --seeds 0 1 2
"""

from __future__ import annotations

from bench_common import learn_sb3, main, run_corral

TARGET = 475.0
BUDGET = 500_000  # rl-zoo's n_timesteps


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)
    return learn_sb3(model, BUDGET, TARGET)


if __name__ == "__main__":
    main({"corral": lambda s: run_corral("a2c", "CartPole-v1", BUDGET, s, TARGET), "sb3": run_sb3}, "sb3", TARGET)
