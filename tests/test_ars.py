"""ARS: known answers (the update against its formula on hand-made returns, the candidates'
parameters, the returns scored per candidate, V2's normalization statistics), isolation (only
the update moves theta), a CLI smoke run, exact resume mid-iteration, candidates on collectors
(in process and on Ray, the same result for the same seed), and CartPole learning."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import corral
from corral.algos import get_algo
from corral.algos.ars import ars_step
from corral.algos.base import Step
from corral.cli import main
from corral.errors import UserError
from corral.rng import RNGStreams
from corral.schemes.fragments import FragmentScheme
from corral.train.learner import Learner
from corral.train.setup import build_config

BOX = gym.spaces.Box(-5, 5, (3,), np.float32)
QUIET = {"eval.episodes": 0, "progress": False, "tensorboard": False}


def build(num_envs=2, act_space=gym.spaces.Discrete(2), seed=0, **over):
    cfg = get_algo("ars").cls.Config(**over)
    return get_algo("ars").cls(cfg, BOX, act_space, num_envs, torch.device("cpu"), RNGStreams(seed))


def step(algo, obs, reward, ended):
    """One vector step through explore / observe / episodes_ended; returns the extras."""
    with torch.no_grad():
        _, ex = algo.explore(obs)
        ended = torch.tensor(ended)
        algo.observe(Step(obs, ex, torch.tensor(reward, dtype=torch.float32), ended, torch.zeros_like(ended),
                          obs, obs))
        algo.episodes_ended(ended)
    return ex


# --- the update


def test_the_step_is_the_papers_formula_on_hand_made_returns():
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(3, 4, generator=g, dtype=torch.float64)
    returns = torch.tensor([1.0, 5.0, 2.0, 3.0, 0.0, 2.0], dtype=torch.float64)  # r+ then r-
    change, stats = ars_step(returns, deltas, n_top=2, lr=0.1)
    # max(r+, r-) = [3, 5, 2]: the top two directions are 1 then 0
    used = np.array([5.0, 1.0, 0.0, 3.0])
    sigma = used.std(ddof=1)
    expected = 0.1 / (2 * sigma + 1e-6) * ((5.0 - 0.0) * deltas[1] + (1.0 - 3.0) * deltas[0])
    torch.testing.assert_close(change, expected)
    assert stats["return_std"] == pytest.approx(sigma) and stats["step_size"] == pytest.approx(0.1 / (2 * sigma + 1e-6))
    # all directions (V1/V2 without -t)
    change, _ = ars_step(returns, deltas, n_top=3, lr=0.1)
    sigma = returns.numpy().std(ddof=1)
    expected = 0.1 / (3 * sigma + 1e-6) * ((1 - 3) * deltas[0] + (5 - 0) * deltas[1] + (2 - 2) * deltas[2])
    torch.testing.assert_close(change, expected)


def test_an_iteration_scores_each_candidate_by_its_episode_and_steps_theta_by_the_formula():
    algo = build(num_envs=2, n_delta=1, alive_bonus_offset=0.5, lr=0.1, delta_std=0.2)
    theta0, deltas = algo.actor.theta.clone(), algo.actor.deltas.clone()
    obs = torch.zeros(2, 3)
    ex = step(algo, obs, [1.0, 1.0], [False, False])
    assert ex.candidate.tolist() == [0, 1] and ex.iteration.tolist() == [0, 0]  # one candidate per column
    step(algo, obs, [2.0, 1.0], [True, False])  # column 0's episode (candidate 0) ends: 3 + 2 * 0.5
    assert not algo.ready()
    ex = step(algo, obs, [7.0, 1.0], [False, True])  # column 0 idles on theta; column 1's ends: 3 + 3 * 0.5
    assert ex.candidate.tolist() == [-1, 1]
    assert algo.ready()
    assert algo.returns.tolist() == [4.0, 4.5] and algo.lengths.tolist() == [2, 3]
    stats = algo.update(0.0)
    change, _ = ars_step(torch.tensor([4.0, 4.5], dtype=torch.float64), deltas, 1, 0.1)
    torch.testing.assert_close(algo.actor.theta, theta0 + change)
    assert stats["idle_frac"] == pytest.approx(1 / 6) and int(algo.actor.iteration) == 1
    assert not torch.equal(algo.actor.deltas, deltas)  # the next iteration's directions


def test_candidates_act_with_theta_plus_and_minus_the_scaled_directions():
    algo = build(num_envs=5, act_space=gym.spaces.Box(-1, 1, (2,), np.float32), n_delta=2, delta_std=0.3,
                 zero_policy=False)
    a = algo.actor
    obs = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        actions, ex = algo.explore(obs)
    assert ex.candidate.tolist() == [0, 1, 2, 3, -1]  # the fifth column has no candidate left: theta
    signs = [1, 1, -1, -1]
    for j in range(4):
        w = (a.theta + signs[j] * 0.3 * a.deltas[j % 2]).view(2, 3)
        torch.testing.assert_close(actions[j], (obs[j] @ w.T).clamp(-1, 1))  # linear policy, clipped
    torch.testing.assert_close(actions[4], a.act(obs[4:5])[0])


def test_v2_per_iteration_normalizes_with_every_state_seen_and_refreshes_once_per_iteration():
    algo = build(num_envs=2, n_delta=1, normalize_obs=True, norm_update="iteration")
    g = torch.Generator().manual_seed(3)
    seen = []
    for t in range(4):
        obs = torch.randn(2, 3, generator=g) * 3 + 1
        seen.append(obs)
        step(algo, obs, [1.0, 1.0], [t == 3, t == 3])
        # frozen within the iteration: the policy still sees raw observations (mean 0, var 1)
        assert algo.actor.obs_norm.count.item() == 0
    assert algo.ready()
    algo.update(0.0)
    x = torch.cat(seen).double()
    norm = algo.actor.obs_norm
    assert norm.count.item() == 8
    torch.testing.assert_close(norm.mean, x.mean(0))
    torch.testing.assert_close(norm.var, x.var(0, unbiased=False))
    o = torch.randn(4, 3, generator=g)
    torch.testing.assert_close(algo.actor.normalize(o), ((o.double() - x.mean(0)) / (x.var(0, unbiased=False) + 1e-8)
                                                         .sqrt()).float().clamp(-10, 10))
    v1 = build(num_envs=2, n_delta=1)  # V1: no normalization at all
    assert torch.equal(v1.actor.normalize(o), o)


def test_v2_per_step_normalizes_each_observation_with_every_state_seen_up_to_it():
    # norm_update=step (the default, rl-zoo's VecNormalize): the statistics take each vector step
    # first, then the policy acts on the observations normalized with them
    algo = build(num_envs=2, act_space=gym.spaces.Box(-50, 50, (2,), np.float32), n_delta=1, normalize_obs=True,
                 zero_policy=False, delta_std=0.3)
    a = algo.actor
    g = torch.Generator().manual_seed(4)
    seen = []
    for t in range(5):
        obs = torch.randn(2, 3, generator=g) * 3 + 1
        seen.append(obs)
        x = torch.cat(seen).double()
        expected_norm = ((obs.double() - x.mean(0)) / (x.var(0, unbiased=False) + 1e-8).sqrt()).float().clamp(-10, 10)
        with torch.no_grad():
            actions, ex = algo.explore(obs)
        assert ex.candidate.tolist() == [0, 1]
        for j, sign in enumerate((1, -1)):
            w = (a.theta + sign * 0.3 * a.deltas[0]).view(2, 3)
            torch.testing.assert_close(actions[j], (expected_norm[j] @ w.T).clamp(-50, 50))
        assert a.seen.count.item() == 2 * (t + 1)
    # the central policy (evaluation) normalizes with the same statistics, without adding to them
    o = torch.randn(1, 3, generator=g)
    x = torch.cat(seen).double()
    w = a.theta.view(2, 3)
    expected = ((o.double() - x.mean(0)) / (x.var(0, unbiased=False) + 1e-8).sqrt()).float().clamp(-10, 10) @ w.T
    torch.testing.assert_close(a.act(o), expected.clamp(-50, 50))
    assert a.seen.count.item() == 10


def test_only_the_update_moves_theta():
    algo = build(num_envs=4, n_delta=2, zero_policy=False)
    theta = algo.actor.theta.clone()
    obs = torch.randn(4, 3)
    for t in range(3):
        step(algo, obs, [1.0, 2.0, 3.0, 4.0], [t == 2] * 4)
        assert torch.equal(algo.actor.theta, theta)  # acting with candidates perturbs copies, never theta
    algo.update(0.0)
    assert not torch.equal(algo.actor.theta, theta)


def test_n_top_above_n_delta_and_image_observations_are_refused():
    with pytest.raises(UserError, match="n_top"):
        build(n_delta=2, n_top=3)
    img = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    with pytest.raises(UserError, match="flat vector"):
        get_algo("ars").cls(get_algo("ars").cls.Config(), img, gym.spaces.Discrete(2), 1, torch.device("cpu"),
                            RNGStreams(0))


# --- runs


@pytest.mark.parametrize("env_id,sets", [("CartPole-v1", []), ("Pendulum-v1", ["--set", "env.num_envs=8",
                                                                                "--set", "ars.hidden=[16]"])])
def test_cli_smoke(tmp_path, env_id, sets):
    assert main(["train", "ars", env_id, "--steps", "2000", "--run-dir", str(tmp_path / "r"), *sets,
                 "--set", "eval.episodes=1", "--set", "progress=false", "--set", "tensorboard=false"]) == 0
    agent = corral.load(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert agent.algo.name == "ars"


def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    # the checkpoint at n falls inside an iteration: columns, scores so far and env states are saved
    sets = ["ars.n_delta=2", "ars.normalize_obs=true", "ars.delta_std=0.5", "env.num_envs=3",
            "eval.episodes=0", "progress=false", "tensorboard=false"]
    n = 1201
    a = Learner(build_config("ars", "CartPole-v1", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", "ars", "CartPole-v1", "--steps", str(n), "--seed", "3", "--run-dir",
                 str(tmp_path / "b"), *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for k, v in a.algo.actor.state_dict().items():
        assert torch.equal(v, b.algo.actor.state_dict()[k]), k
    assert a.algo.updates >= 8


def _collectors_run(backend: str, steps: int = 3000, norm_update: str = "step"):
    L = Learner(build_config("ars", "CartPole-v1", steps=steps, seed=5, overrides={
        **QUIET, "scheme.collectors": 2, "scheme.backend": backend, "env.num_envs": 2, "ars.n_delta": 3,
        "ars.normalize_obs": True, "ars.norm_update": norm_update}), None)
    if backend == "local":
        scheme = FragmentScheme(L)
        L.make_stream = scheme.stream
    L.train()
    return L


@pytest.mark.parametrize("norm_update", ["step", "iteration"])
def test_collectors_score_their_share_of_the_candidates_in_process(norm_update):
    L = _collectors_run("local", norm_update=norm_update)
    assert L.env_steps == 3000 and L.algo.updates >= 4
    assert L.algo.actor.seen.count.item() >= 3000  # every state the collectors acted on, merged back
    # per iteration: the normalizing copy is refreshed at the updates; per step: seen itself normalizes
    assert (L.algo.actor.obs_norm.count.item() > 0) == (norm_update == "iteration")


def test_collectors_on_ray_give_the_in_process_collectors_result(ray_local):
    local, remote = _collectors_run("local"), _collectors_run("ray")
    assert remote.algo.updates == local.algo.updates >= 4
    for k, v in local.algo.actor.state_dict().items():
        assert torch.equal(v, remote.algo.actor.state_dict()[k]), k


# --- learning: the CartPole preset (rl-zoo's ars.yml: n_delta 2, linear policy, 1 env, 50k steps)
# and the same search with its 4 candidates on 4 env columns at once; seed 0, periodic deterministic
# evaluation (5 episodes every 5k steps, stop at the first 500), then a held-out evaluation of that
# best checkpoint on other seeds (20 episodes). docs/algos/ars.md has the figures.


@pytest.mark.parametrize("num_envs", [1, 4])
def test_ars_reaches_475_on_cartpole_within_rl_zoos_budget(tmp_path, num_envs):
    corral.train("ars", "CartPole-v1", seed=0, run_dir=str(tmp_path / "run"),
                 **{"env.num_envs": num_envs, "eval.every": 5000, "eval.episodes": 5, "eval.stop_at_return": 500,
                    "tensorboard": False, "progress": False})
    agent = corral.load(tmp_path / "run")  # its best.pt
    assert agent.cfg.steps <= 50_000
    assert corral.evaluate(agent, "CartPole-v1", episodes=20, seed=123)["mean_return"] >= 475
