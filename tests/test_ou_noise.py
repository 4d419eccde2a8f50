"""TD3's and DDPG's Ornstein-Uhlenbeck exploration noise (``exploration_noise_type``, corral/algos/td3.py):
the recursion against its closed form with the same normal draws, the noise an action gets from the
algorithm's own generator, the reset where an episode starts, exact resume, rl-zoo's entries, and
the algorithms that act with other noise refusing the key."""

import importlib.util

import gymnasium as gym
import pytest
import torch

import corral
from corral.algos import get_algo
from corral.algos.td3 import OU_DT, OU_THETA, ornstein_uhlenbeck_step
from corral.cli import main
from corral.errors import UserError
from corral.rng import RNGStreams
from corral.train.learner import Learner
from corral.train.setup import build_config

HAVE_ZOO = importlib.util.find_spec("rl_zoo3") is not None
OBS, ACT = gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(-2.0, 2.0, (2,))


def make(algo="td3", num_envs=3, **overrides):
    spec = get_algo(algo)
    cfg = spec.cls.Config()
    for k, v in {**spec.overrides, "exploration_noise_type": "ornstein-uhlenbeck", "exploration_noise": 0.5,
                 "learning_starts": 0, "hidden": (16,), **overrides}.items():
        setattr(cfg, k, v)
    return spec.cls(cfg, OBS, ACT, num_envs, torch.device("cpu"), RNGStreams(0))


def test_the_recursion_is_the_discretised_process_in_closed_form():
    # x_t = sum_k (1 - theta dt)^(t-1-k) sigma sqrt(dt) n_k from x_0 = 0, the same draws n_k
    g = torch.Generator().manual_seed(0)
    normals = torch.randn(200, 4, generator=g, dtype=torch.float64)
    sigma, x, xs = 0.3, torch.zeros(4, dtype=torch.float64), []
    for n in normals:
        x = ornstein_uhlenbeck_step(x, sigma, n)
        xs.append(x)
    decay = 1 - OU_THETA * OU_DT
    for t in (0, 1, 9, 199):
        closed = sum(decay ** (t - k) * sigma * OU_DT ** 0.5 * normals[k] for k in range(t + 1))
        assert torch.allclose(xs[t], closed, rtol=1e-12, atol=1e-15)
    assert (OU_THETA, OU_DT) == (0.15, 1e-2)  # SB3's OrnsteinUhlenbeckActionNoise defaults


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_each_action_gets_the_process_driven_by_the_noise_stream(algo):
    a = make(algo)
    obs = torch.randn(3, 3, generator=torch.Generator().manual_seed(1))
    replay = torch.Generator().manual_seed(0)
    replay.set_state(a.rng["noise"].get_state())
    x = torch.zeros(3, 2)
    with torch.no_grad():
        mean = a.actor(a.actor.enc(obs))
        for _ in range(5):
            env_action, _ = a.explore(obs)
            x = x + OU_THETA * (0.0 - x) * OU_DT + 0.5 * OU_DT ** 0.5 * torch.randn(3, 2, generator=replay)
            assert torch.allclose(env_action, a.actor.box.to_env((mean + x).clamp(-1, 1)), atol=1e-6)
    assert torch.allclose(a.ou_noise, x, atol=1e-7)


def test_the_noise_restarts_from_zero_where_an_episode_starts():
    a = make()
    obs = torch.zeros(3, 3)
    with torch.no_grad():
        for _ in range(20):
            a.explore(obs)
    before = a.ou_noise.clone()
    assert (before != 0).all()
    a.episodes_ended(torch.tensor([False, True, False]))
    assert torch.equal(a.ou_noise[1], torch.zeros(2))
    assert torch.equal(a.ou_noise[[0, 2]], before[[0, 2]])
    replay = torch.Generator().manual_seed(0)
    replay.set_state(a.rng["noise"].get_state())
    with torch.no_grad():
        a.explore(obs)
    n = torch.randn(3, 2, generator=replay)
    assert torch.allclose(a.ou_noise[1], 0.5 * OU_DT ** 0.5 * n[1])  # a fresh process: one step from 0
    assert torch.allclose(a.ou_noise[0], before[0] * (1 - OU_THETA * OU_DT) + 0.5 * OU_DT ** 0.5 * n[0])


def test_the_learner_resets_the_columns_whose_episode_ended():
    L = Learner(build_config("td3", "Pendulum-v1", steps=10**6, seed=0,
                             sets=["td3.exploration_noise_type=ornstein-uhlenbeck", "td3.learning_starts=1000000",
                                   "env.num_envs=2", "eval.episodes=0", "progress=false", "tensorboard=false"]), None)
    algo = L.algo
    rewarded, ended = algo.step_hooks()
    assert ended is not None  # the Learner says where episodes ended
    with torch.no_grad():
        for t in range(200):  # Pendulum's episodes are 200 steps: both end at the last one
            a, ex = algo.explore(L.obs)
            L.obs, r, te, tr, info = L.env.step(a)
            if t < 199:
                assert not (te | tr).any()
            ended(te | tr)
    assert torch.equal(algo.ou_noise, torch.zeros(2, 1))


def test_gaussian_noise_is_the_default_and_carries_no_state():
    a = make(exploration_noise_type="normal")
    assert a.cfg.exploration_noise_type == "normal" and a.ou_noise is None
    assert a.column_state() == {} and "ou_noise" not in a.extra_state()


def test_trained_2n_equals_n_then_resumed_bit_for_bit_with_ou_noise(tmp_path):
    sets = ["td3.exploration_noise_type=ornstein-uhlenbeck", "td3.exploration_noise=0.5", "td3.learning_starts=100",
            "td3.batch_size=32", "td3.hidden=[32, 32]", "env.num_envs=2", "eval.episodes=0", "progress=false",
            "tensorboard=false"]
    n = 302  # the checkpoint falls inside an episode: the resumed run goes on with the saved noise
    a = Learner(build_config("td3", "Pendulum-v1", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", "td3", "Pendulum-v1", "--steps", str(n), "--seed", "3", "--run-dir", str(tmp_path / "b"),
                 *sum((["--set", s] for s in sets), [])]) == 0
    at_n = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt").algo
    assert (at_n.ou_noise != 0).all()  # the checkpoint carries the process (a fresh one is 0)
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for name in ("actor", "critics"):
        pa = torch.cat([p.flatten() for p in getattr(a.algo, name).state_dict().values()])
        pb = torch.cat([p.flatten() for p in getattr(b.algo, name).state_dict().values()])
        assert torch.equal(pa, pb), name
    assert torch.equal(a.algo.ou_noise, b.algo.ou_noise) and (a.algo.ou_noise != 0).all()


@pytest.mark.parametrize("algo", ["apex_td3", "maddpg"])
def test_algorithms_acting_with_other_noise_refuse_the_key(algo):
    with pytest.raises(UserError, match="exploration_noise_type"):
        build_config(algo, "Pendulum-v1", sets=[f"{algo}.exploration_noise_type=ornstein-uhlenbeck"])


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_rl_zoo_ou_entries_translate_with_nothing_refused(algo):
    from corral import zoo as Z

    data = __import__("yaml").safe_load(Z.bundled_file(algo).read_text())
    t = Z.translate(algo, data, "MountainCarContinuous-v0", is_atari=False)
    assert t.refused == {} and (f"{algo}.exploration_noise_type", "ornstein-uhlenbeck") in t.pairs
    a = build_config(algo, "MountainCarContinuous-v0", zoo=True).algo_cfg
    assert a.exploration_noise_type == "ornstein-uhlenbeck" and a.exploration_noise == 0.5
    # rl-zoo's normal entries keep Gaussian noise
    t = Z.translate(algo, data, "Pendulum-v1", is_atari=False)
    assert t.refused == {} and not any(k.endswith("exploration_noise_type") for k, _ in t.pairs)
