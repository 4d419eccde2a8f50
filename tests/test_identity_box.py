"""Stable-Baselines3's continuous identity test (``IdentityEnvBox(eps=0.5)``, 64x64 networks,
gamma 0.95, its bar: a mean of 90 of 100 over 20 episodes) at SB3's settings and budgets.

SB3's ``learn(3000)`` for PPO runs whole rollouts of its 2,048 steps: two of them, 4,096 env
steps; corral stops at the budget it is given, so the same training is ``steps=4096``. A2C is
not here: at SB3's settings and 3,500 steps SB3's own A2C scores 84.9 / 87.5 / 74.0 / 99.7 / 71.6
on seeds 0-4 and corral's 64.9 / 89.0 / 88.7 / 87.5 / 81.1 (SB3 passes on its seed 0 only)."""

import pytest

import corral
from corral import evaluate

QUIET = {"eval.episodes": 0, "progress": False, "tensorboard": False}
ENV = "envs_for_tests:IdentityBoxEnv"


@pytest.mark.parametrize("algo,steps,over", [
    ("ppo", 4096, {"ppo.n_steps": 2048}),
    ("sac", 700, {"sac.learning_starts": 100}),
    # SB3's test gives TD3 Gaussian noise of 0.1 and DDPG none; SB3's DDPG learns at 1e-3
    ("td3", 500, {"td3.learning_starts": 100, "td3.exploration_noise": 0.1}),
    ("ddpg", 500, {"ddpg.learning_starts": 100, "ddpg.lr": 1e-3, "ddpg.exploration_noise": 0.0}),
])
def test_continuous_identity_at_stable_baselines3s_bar(algo, steps, over):
    agent = corral.train(algo, ENV, steps=steps, seed=0, save_run=False,
                         **{**QUIET, f"{algo}.gamma": 0.95, f"{algo}.hidden": [64, 64], **over})
    assert evaluate(agent, episodes=20, seed=123)["mean_return"] >= 90
