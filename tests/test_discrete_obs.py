"""Discrete, MultiDiscrete and MultiBinary observations: stored as integers, one-hot encoded
(or taken as 0/1 floats) once, inside the networks; Stable-Baselines3's identity envs at its
own bar and budgets; the toy-text family."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs_for_tests import DiscretePartEnv

import corral
from corral.actors.actor_critic import MultiInputEncoder
from corral.envs.spaces import FlattenParts, layout_of
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
    obs = torch.tensor([[2.0, 60.0, -30.0]])  # cell 2 (one slot), then vec
    if algo == "ppo":
        x = actor.normalize(obs)  # what rollouts store
        assert x[0, 0] == 2.0  # the integer part passes through as it is
        assert abs(x[0, 1].item()) < 5  # the vector part is normalized (raw 60)
    else:
        x = actor.enc(obs)  # what the Q-network's MLP sees
        assert torch.equal(x[0, :5], torch.tensor([0.0, 0, 1, 0, 0]))  # one-hot, not normalized
        assert abs(x[0, 5].item()) < 5


# ---------------------------------------------------------------------------
# integer parts of Dict and Tuple observations: one slot per integer in the flat vector,
# one-hot in the encoder


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_discrete_part_of_a_dict_is_stored_in_one_slot_not_500(algo):
    over = {"eval.episodes": 0, "env.num_envs": 2, **QUIET}
    over.update({"ppo.n_steps": 4, "ppo.batch_size": 8} if algo == "ppo" else {"dqn.learning_starts": 4})
    L = Learner(build_config(algo, "envs_for_tests:BigCellEnv", steps=8, overrides=over), None, quiet=True)
    for _ in L.stream():
        pass
    if algo == "ppo":
        assert L.algo.storage.data.obs.shape == (4, 2, 1 + 2)
    else:
        assert L.algo.replay.obs_shape == (3,) and L.algo.replay.obs_nbytes == 3 * 4
    net = L.algo.actor if algo == "ppo" else L.algo.actor.enc
    assert net.parts.out_dim == 500 + 2  # the one-hot is made in the encoder


def test_the_encoder_gives_the_one_hot_that_gymnasium_flatten_gives():
    """What the networks see of a Dict is what they saw when the flat vector held one-hots
    (``gymnasium.spaces.flatten``): Discrete with a start, MultiDiscrete, MultiBinary, Box, image."""
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(500, start=-3), "b": gym.spaces.Box(-1, 1, (2,)),
                             "c": gym.spaces.MultiDiscrete([2, 3]), "d": gym.spaces.MultiBinary(3),
                             "e": gym.spaces.Tuple((gym.spaces.Discrete(2),))})  # nested: flattened by gymnasium
    space.seed(0)

    class E(gym.Env):
        observation_space = space
        action_space = gym.spaces.Discrete(2)

    env = FlattenParts(E())
    layout = layout_of(env.observation_space)
    assert [p.stop - p.start for p in layout] == [1, 2, 2, 3, 2]
    enc = MultiInputEncoder(layout)
    samples = [space.sample() for _ in range(16)]
    flat = torch.tensor(np.stack([env.observation(o) for o in samples]))
    old = torch.tensor(np.stack([gym.spaces.flatten(space, o) for o in samples]), dtype=torch.float32)
    assert flat.shape == (16, 10) and torch.equal(enc(flat), old)


def test_an_older_checkpoint_with_one_hot_parts_loads_its_normalizer():
    """corral before compact integer parts saved normalizer statistics one column per category."""
    from corral.actors.actor_critic import ActorCritic

    env = FlattenParts(DiscretePartEnv())  # cell: Discrete(5), vec: Box(2)
    actor = ActorCritic(env.observation_space, env.action_space)
    state = actor.state_dict()
    state["obs_norm.mean"] = torch.tensor([9.0, 9, 9, 9, 9, 50, -30], dtype=torch.float64)  # 5 + 2 columns
    state["obs_norm.var"] = torch.tensor([1.0, 1, 1, 1, 1, 4, 9], dtype=torch.float64)
    actor.load_state_dict(state)
    assert actor.obs_norm.mean.tolist() == [9.0, 50.0, -30.0] and actor.obs_norm.var.tolist()[1:] == [4.0, 9.0]


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_continuous_off_policy_actors_take_dicts_with_integer_parts(algo):
    agent = corral.train(algo, "envs_for_tests:DictCellTarget", steps=300, seed=0, save_run=False,
                         **{"eval.episodes": 0, f"{algo}.learning_starts": 100, f"{algo}.batch_size": 32, **QUIET})
    assert agent.algo.replay.obs_shape == (3,)  # cell: one slot
    assert agent.algo.actor.enc.dim == 4 + 2 and not agent.algo.actor.enc.trainable
    assert corral.evaluate(agent, "envs_for_tests:DictCellTarget", episodes=4)["mean_return"] > -2


@pytest.mark.parametrize("algo,steps,over", [
    ("ppo", 10_000, {"ppo.gamma": 0.4}),
    ("dqn", 4_000, {"dqn.learning_starts": 0}),
])
def test_a_dict_with_an_integer_part_is_learned(algo, steps, over):
    """The identity task with its Discrete(8, start=3) cell inside a Dict (beside noise):
    Stable-Baselines3's identity bar and budgets."""
    env = "envs_for_tests:DictIdentityEnv"
    agent = corral.train(algo, env, steps=steps, seed=1, save_run=False, **{"eval.episodes": 0, **QUIET, **over})
    assert evaluate(agent, env) >= 90


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


def test_ppo_reaches_a_mean_return_of_7_on_taxi():
    """The Taxi-v4 preset (512 envs, entropy 0.1, 1M steps; 30-46 s on a 2-core machine):
    greedy eval 7.9 over 20 episodes on seeds 0-3 (Taxi's best is about 8)."""
    agent = corral.train("ppo", "Taxi-v4", seed=0, save_run=False, **{"eval.episodes": 0, **QUIET})
    assert agent.cfg.steps <= 1_000_000  # (whole rollouts of 512 x 16: 1,000,448 env steps)
    assert evaluate(agent, "Taxi-v4") >= 7


@pytest.mark.slow  # about 105 s alone; the PPO Taxi test keeps the integer-observation learning bar in CI
def test_dqn_reaches_a_mean_return_of_7_on_taxi():
    """The Taxi-v4 preset (Double DQN, 4 envs, 200k steps; about 105 s on one core): greedy
    eval 7.9 over 20 episodes on seeds 0-2."""
    agent = corral.train("dqn", "Taxi-v4", seed=0, save_run=False, **{"eval.episodes": 0, **QUIET})
    assert agent.cfg.steps <= 200_000
    assert evaluate(agent, "Taxi-v4") >= 7


def test_blackjack_a_tuple_of_discretes_is_stored_in_three_slots_and_learned():
    """Blackjack-v1's observation is Tuple(Discrete(32), Discrete(11), Discrete(2)): 3 stored
    slots, 45 one-hot features. PPO's defaults, 30k steps (about 16 s on one core): mean
    return -0.046 over 2000 games on seed 0; always sticking scores about -0.17."""
    agent = corral.train("ppo", "Blackjack-v1", steps=30_000, seed=0, save_run=False, **{"eval.episodes": 0, **QUIET})
    assert agent.algo.storage.data.obs.shape[-1] == 3 and agent.actor.parts.out_dim == 45
    assert corral.evaluate(agent, "Blackjack-v1", episodes=2000, seed=1000)["mean_return"] >= -0.12
