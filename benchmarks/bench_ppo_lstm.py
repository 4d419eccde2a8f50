"""Time to a last-20 training return of 475 on CartPoleNoVel-v1 (CartPole without its
velocities): corral's recurrent PPO vs sb3-contrib's RecurrentPPO.

Both at rl-baselines3-zoo's ``ppo_lstm.yml`` values for the env (8 envs, n_steps 32, batch
256, 20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 and clip 0.2, normalized
observations, a 64-unit LSTM, ReLU heads of 64), alternating per seed in one process so both
see the same machine load, one torch thread each, the same Gymnasium env (corral registers
``CartPoleNoVel-v1``; SB3 builds it with ``gym.make``). Runs:

* corral: ``corral train ppo_lstm CartPoleNoVel-v1`` (its preset: those values, one LSTM
  shared by the policy and value heads);
* corral-sep: the same with separate policy and value LSTMs (``ppo_lstm.shared_core=false``),
  the architecture of rl-zoo's preset (``enable_critic_lstm=True``): framework for framework;
* sb3-contrib at rl-zoo's values.

Time is training time from the first env step, checked after every update for corral and
after every env step for SB3 (which favours SB3 slightly).

    pip install 'corral[bench]'    # stable-baselines3, sb3-contrib
    python benchmarks/bench_ppo_lstm.py --seeds 0 1 2
"""

from __future__ import annotations

import torch
from bench_common import learn_sb3, main, run_corral

TARGET = 475.0
BUDGET = 150_000
ENV = "CartPoleNoVel-v1"


def run_sb3(seed: int) -> dict:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import corral.envs  # noqa: F401  (registers CartPoleNoVel-v1)

    env = VecNormalize(make_vec_env(ENV, n_envs=8, seed=seed), norm_obs=True, norm_reward=False)

    def lin(v):
        return lambda progress: progress * v

    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                         ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu",
                         verbose=0, policy_kwargs={"ortho_init": False, "activation_fn": torch.nn.ReLU,
                                                   "lstm_hidden_size": 64, "enable_critic_lstm": True,
                                                   "net_arch": {"pi": [64], "vf": [64]}})
    return learn_sb3(model, BUDGET, TARGET)


if __name__ == "__main__":
    main({"corral": lambda s: run_corral("ppo_lstm", ENV, BUDGET, s, TARGET),
          "corral-sep": lambda s: run_corral("ppo_lstm", ENV, BUDGET, s, TARGET, ("ppo_lstm.shared_core=false",)),
          "sb3-contrib": run_sb3}, "sb3-contrib", TARGET)
