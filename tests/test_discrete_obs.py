"""Discrete, MultiDiscrete and MultiBinary observations: stored as integers, one-hot encoded
(or taken as 0/1 floats) once, inside the networks; Stable-Baselines3's identity envs at its
own bar and budgets; the toy-text family."""

import gymnasium as gym
import pytest
import torch

import corral
from corral.nets import OneHotEncoder
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False}


def evaluate(agent, env, episodes=20):
    return corral.evaluate(agent, env, episodes=episodes, seed=1000)["mean_return"]


# ---------------------------------------------------------------------------
# the encoding and what is stored


def test_one_hot_encoder_against_hand_worked_rows():
    enc = OneHotEncoder(gym.spaces.Discrete(4, start=1))
    assert torch.equal(enc(torch.tensor([1, 4])), torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1]]))
    enc = OneHotEncoder(gym.spaces.MultiDiscrete([2, 3]))
    assert torch.equal(enc(torch.tensor([[1, 0], [0, 2]])), torch.tensor([[0.0, 1, 1, 0, 0], [1, 0, 0, 0, 1]]))
    enc = OneHotEncoder(gym.spaces.MultiBinary(3))
    assert torch.equal(enc(torch.tensor([[1, 0, 1]], dtype=torch.int8)), torch.tensor([[1.0, 0, 1]]))
    assert enc.out_dim == 3 and OneHotEncoder(gym.spaces.MultiDiscrete([2, 3])).out_dim == 5


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_stored_observations_keep_their_integer_dtype_and_are_encoded_once_in_the_network(algo, monkeypatch):
    calls = []
    inner = OneHotEncoder.forward

    def counting(self, x):
        assert not x.is_floating_point()  # what reaches the network is the stored integers
        calls.append(x.shape[0])
        return inner(self, x)

    monkeypatch.setattr(OneHotEncoder, "forward", counting)
    over = {"eval.episodes": 0, "env.num_envs": 2, **QUIET}
    if algo == "ppo":
        over.update({"ppo.n_steps": 8, "ppo.batch_size": 16, "ppo.n_epochs": 1})
    else:
        over.update({"dqn.learning_starts": 8, "dqn.batch_size": 4, "dqn.train_freq": 4})
    L = Learner(build_config(algo, "FrozenLake-v1", steps=16, overrides=over), None, quiet=True)
    calls.clear()
    for _ in L.stream():
        pass
    if algo == "ppo":
        d = L.algo.storage.data
        assert d.obs.dtype == torch.long and d.obs.shape == (8, 2)  # one integer per step, not 16 floats
        assert d.final_obs.dtype == torch.long
        # one encoding per forward pass: 8 acting steps of 2 envs, the bootstrap value, one
        # whole-batch minibatch of 16
        assert calls == [2] * 8 + [2, 16]
    else:
        r = L.algo.replay
        assert r.obs_dtype == torch.int64 and r.obs_nbytes == 8
        assert calls  # the Q-network encoded the stored integers


def test_multibinary_observations_are_stored_as_bytes():
    cfg = build_config("ppo", "envs_for_tests:identity_multibinary", steps=8,
                       overrides={"eval.episodes": 0, "env.num_envs": 2, "ppo.n_steps": 4, "ppo.batch_size": 8, **QUIET})
    L = Learner(cfg, None, quiet=True)
    for _ in L.stream():
        pass
    assert L.algo.storage.data.obs.dtype == torch.uint8 and L.algo.storage.data.obs.shape == (4, 2, 3)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_normalizer_skips_discrete_parts_of_dict_observations(algo):
    over = {"eval.episodes": 0, "env.num_envs": 2, f"{algo}.normalize_obs": True, **QUIET}
    if algo == "ppo":
        over.update({"ppo.n_steps": 8, "ppo.batch_size": 16})
    else:
        over.update({"dqn.learning_starts": 1000})
    L = Learner(build_config(algo, "envs_for_tests:DiscretePartEnv", steps=32, overrides=over), None, quiet=True)
    for _ in L.stream():
        pass
    actor = L.algo.actor
    obs = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 60.0, -30.0]])  # cell 2 one-hot, then vec
    x = actor.normalize(obs) if algo == "ppo" else actor.enc(obs)
    assert torch.equal(x[0, :5], obs[0, :5])  # the one-hot part passes through as it is
    assert abs(x[0, 5].item()) < 5  # the vector part is normalized (raw 60)


# ---------------------------------------------------------------------------
# Stable-Baselines3's identity tests: its bar (mean >= 90 of 100 over 20 episodes) and budgets


@pytest.mark.parametrize("algo,env,steps,over", [
    ("ppo", "envs_for_tests:identity_discrete", 10_000, {"ppo.gamma": 0.4}),
    ("dqn", "envs_for_tests:identity_discrete", 4_000, {"dqn.learning_starts": 0}),
    ("ppo", "envs_for_tests:identity_multidiscrete", 3_000, {"ppo.gamma": 0.5}),
    ("ppo", "envs_for_tests:identity_multibinary", 3_000, {"ppo.gamma": 0.5}),
])
def test_identity_envs_at_stable_baselines3s_bar(algo, env, steps, over):
    agent = corral.train(algo, env, steps=steps, seed=1, save_run=False, **{"eval.episodes": 0, **QUIET, **over})
    assert evaluate(agent, env) >= 90


# ---------------------------------------------------------------------------
# the toy-text family


@pytest.mark.parametrize("algo,steps", [("ppo", 20_000), ("dqn", None)])
def test_frozen_lake_without_slipping_is_solved(algo, steps):
    agent = corral.train(algo, "FrozenLake-v1", steps=steps, seed=0, save_run=False,
                         **{"env.kwargs": {"is_slippery": False}, "eval.episodes": 0, **QUIET})
    env = gym.make("FrozenLake-v1", is_slippery=False)
    assert evaluate(agent, env, episodes=10) == 1.0


@pytest.mark.slow
def test_dqn_reaches_a_mean_return_of_7_on_taxi():
    """The Taxi-v4 preset (Double DQN, 250k steps, about 3.5 min on one core): greedy eval 7.4
    on seed 0. Not yet CI-sized, hence slow."""
    agent = corral.train("dqn", "Taxi-v4", seed=0, save_run=False, **{"eval.episodes": 0, **QUIET})
    assert evaluate(agent, "Taxi-v4") >= 7
