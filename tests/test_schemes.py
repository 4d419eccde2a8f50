"""Distributed schemes: fragments, normalizer merging, gradient workers, collector restarts,
checkpoints that move between distributed and in-process runs, and PPO with two Ray
collectors learning CartPole.

Tests named ``*_in_process`` run the scheme's collectors in this process (``LocalPool``)
and need no Ray; the others start a small local Ray (2 CPUs) once per session.
"""

import copy
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ray_scheme_killing

import corral
from corral.actors.normalizer import RunningNormalizer
from corral.algos.base import Step
from corral.algos.ppo import PPO
from corral.errors import TrainingError, UserError
from corral.rng import RNGStreams
from corral.schemes.collector import Collector, driver_paths
from corral.schemes.fragments import FragmentScheme
from corral.schemes.grad import LocalGradPool, ShardedPPO, sharded_class
from corral.train.checkpoint import load_checkpoint
from corral.train.learner import Learner
from corral.train.setup import build_config, new_run_dir

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def learner(algo="ppo", env="CartPole-v1", steps=2048, run_dir=None, **overrides):
    cfg = build_config(algo, env, steps=steps, overrides={**QUIET, **overrides})
    return Learner(cfg, new_run_dir(cfg, str(run_dir)) if run_dir else None, env_spec=env, quiet=True)


def run_in_process(L, callback=None):
    """Train with the scheme's collectors in this process (no Ray)."""
    scheme = FragmentScheme(L)
    scheme.fragment_callback = callback
    L.make_stream = scheme.stream
    return scheme, L.train()


class FlakyEnv(gym.Env):
    """CartPole-shaped; raises in step with probability ``p`` (a simulator that crashes now and then)."""

    def __init__(self, p: float = 0.0, seed: int | None = None):
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.p, self.t = p, 0
        self.rs = np.random.default_rng(seed)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.rs = np.random.default_rng(seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.rs.random() < self.p:
            raise RuntimeError("simulator crashed")
        return self.rs.uniform(-1, 1, 4).astype(np.float32), 1.0, False, self.t >= 20, {}


# ---------------------------------------------------------------------------
# fragments


def test_a_fragment_ends_in_a_boundary_whose_final_observation_is_the_next_observation():
    cfg = build_config("ppo", "CartPole-v1", overrides={"env.num_envs": 3, "ppo.n_steps": 40, "ppo.batch_size": 8})
    c = Collector(cfg, "CartPole-v1", 0, 1, paths=driver_paths())
    _, data = c.collect(None, 0)
    steps = list(data.steps())
    assert len(steps) == 40
    done = data.terminated | data.truncated
    assert done.any(), "40 steps of a random CartPole policy end some episode"
    for t, (obs, extras, reward, term, trunc, final_obs, next_obs, *_) in enumerate(steps):
        assert torch.equal(obs, data.obs[t]) and torch.equal(next_obs, data.obs[t + 1])
        assert torch.equal(trunc, data.truncated[t] | (t == 39))
        # final_obs is the true next observation: obs[t + 1] unless the episode ended at t
        same = (final_obs == next_obs).all(-1)
        assert torch.equal(same | done[t], torch.ones(3, dtype=torch.bool))
    assert data.final_obs.shape[0] == int(done.sum())


def test_a_collector_continues_the_learners_episodes_when_given_its_env_state():
    L = learner(**{"env.num_envs": 2, "ppo.batch_size": 32})
    with torch.no_grad():
        for _ in range(5):
            a, _ = L.algo.explore(L.obs)
            L.obs = L.env.step(a)[0]
    c = Collector(L.cfg, "CartPole-v1", 0, 2, paths=driver_paths(), init={"env": L.env.state_dict(), "obs": L.obs})
    assert torch.equal(c.obs, L.obs)
    for a in ([0, 1], [1, 1], [0, 0]):
        a = torch.tensor(a)
        assert torch.equal(c.env.step(a)[0], L.env.step(a)[0])
    c.close()


# ---------------------------------------------------------------------------
# observation normalizer statistics


def test_merged_normalizer_equals_one_normalizer_that_saw_all_data_in_process():
    seen = []
    L = learner(steps=3 * 2 * 16 * 4, **{"scheme.collectors": 3, "env.num_envs": 2, "ppo.n_steps": 16,
                                         "ppo.batch_size": 32, "ppo.n_epochs": 1, "ppo.normalize_obs": True})
    scheme, _ = run_in_process(L, lambda meta, data: seen.append(data.obs[:-1].reshape(-1, 4)))
    assert len(seen) == 12
    reference = RunningNormalizer((4,))
    for obs in seen:
        reference.update(obs)
    norm = L.algo.actor.obs_norm
    torch.testing.assert_close(norm.count, reference.count)
    torch.testing.assert_close(norm.mean, reference.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(norm.var, reference.var, rtol=1e-10, atol=1e-12)
    # what a checkpoint holds is the merged normalizer
    ckpt = L.state_dict()["algo"]["actor"]
    torch.testing.assert_close(ckpt["obs_norm.mean"], reference.mean, rtol=1e-10, atol=1e-12)


def test_merged_normalizer_from_ray_collectors_equals_one_normalizer_that_saw_all_data(ray_local):
    seen = []
    L = learner(steps=2 * 2 * 16 * 3, **{"scheme.collectors": 2, "env.num_envs": 2, "ppo.n_steps": 16,
                                         "ppo.batch_size": 32, "ppo.n_epochs": 1, "ppo.normalize_obs": True})
    from corral.schemes.ray_scheme import RayScheme

    scheme = RayScheme(L)
    scheme.fragment_callback = lambda meta, data: seen.append(data.obs[:-1].reshape(-1, 4))
    for _ in scheme.stream():
        pass
    assert len(seen) == 6
    reference = RunningNormalizer((4,))
    for obs in seen:
        reference.update(obs)
    torch.testing.assert_close(L.algo.actor.obs_norm.count, reference.count)
    torch.testing.assert_close(L.algo.actor.obs_norm.mean, reference.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(L.algo.actor.obs_norm.var, reference.var, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# gradient workers


def filled_ppo(**overrides):
    """A learner whose PPO rollout is full, ready for one update."""
    L = learner(**overrides)
    algo, env, obs = L.algo, L.env, L.obs
    with torch.no_grad():
        while not algo.ready():
            a, ex = algo.explore(obs)
            nxt, r, te, tr, info = env.step(a)
            algo.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    return L


def twin(L, cls):
    a = cls(L.algo.cfg, L.algo.obs_space, L.algo.act_space, L.algo.num_envs, torch.device("cpu"), RNGStreams(0))
    a.load_state_dict(copy.deepcopy(L.algo.state_dict()))
    a._last_obs = L.algo._last_obs.clone()
    return a


@pytest.mark.parametrize("overrides", [
    {},  # the CartPole preset: one minibatch holding the rollout, 20 epochs
    {"ppo.batch_size": 64, "ppo.n_epochs": 2, "ppo.clip_range_vf": 0.2, "ppo.ent_coef": 0.01},
])
def test_averaged_shard_gradients_equal_the_single_process_gradient_in_process(overrides):
    L = filled_ppo(**overrides)
    plain, sharded = twin(L, PPO), twin(L, sharded_class(L.algo))
    sharded.attach(LocalGradPool(L.cfg, 3, plain.obs_space, plain.act_space), "sync")
    s1, s2 = plain.update(0.3), sharded.update(0.3)
    # the last minibatch's (clipped) gradient, and the parameters after every step
    torch.testing.assert_close(sharded.optimizer.grad, plain.optimizer.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sharded.optimizer.flat, plain.optimizer.flat, rtol=1e-5, atol=1e-6)
    assert s1["minibatches"] == s2["minibatches"]
    assert s2["pg_loss"] == pytest.approx(s1["pg_loss"], rel=1e-4, abs=1e-7)


def test_averaged_gradients_from_ray_workers_equal_the_single_process_gradient(ray_local):
    from corral.schemes.ray_scheme import RayGradPool

    L = filled_ppo(**{"ppo.batch_size": 128, "ppo.n_epochs": 1})
    plain, sharded = twin(L, PPO), twin(L, sharded_class(L.algo))
    pool = RayGradPool(L.cfg, 2, plain.obs_space, plain.act_space, cpus=0.5)
    try:
        sharded.attach(pool, "sync")
        plain.update(0.0)
        sharded.update(0.0)
    finally:
        pool.close()
    torch.testing.assert_close(sharded.optimizer.grad, plain.optimizer.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sharded.optimizer.flat, plain.optimizer.flat, rtol=1e-5, atol=1e-6)


def test_async_gradients_are_applied_as_they_arrive_and_record_their_lag_in_process():
    L = filled_ppo(**{"ppo.batch_size": 64, "ppo.n_epochs": 2})
    sharded = twin(L, sharded_class(L.algo))
    sharded.attach(LocalGradPool(L.cfg, 2, sharded.obs_space, sharded.act_space), "async")
    stats = sharded.update(0.0)
    assert stats["minibatches"] == 8
    # two workers: each gradient after the first two was computed one step behind
    assert stats["grad_lag"] == pytest.approx((0 + 1 + 1 * 6) / 8)


def test_grad_workers_without_collectors_train_in_process_collection(ray_local):
    L = learner(steps=1024, **{"scheme.grad_workers": 2})
    summary = L.train()
    assert summary["env_steps"] == 1024
    assert isinstance(L.algo, ShardedPPO)


# ---------------------------------------------------------------------------
# failures


def test_a_crashing_env_restarts_its_collector_and_nothing_is_lost_in_process():
    L = learner("dqn", FlakyEnv, steps=3000, **{"scheme.collectors": 2, "env.num_envs": 2, "env.kwargs": {"p": 0.002},
                                                 "dqn.learning_starts": 200, "dqn.hidden": [16],
                                                 "scheme.max_restarts": 100})
    scheme, summary = run_in_process(L)
    assert summary["env_steps"] == 3000
    assert scheme.restarts >= 1 and scheme.dropped == scheme.restarts
    assert L.algo.replay.steps_added * 2 == 3000  # every consumed step, none of the dropped ones


def test_a_collector_that_keeps_failing_ends_the_run_with_the_cause_in_process():
    L = learner("ppo", FlakyEnv, steps=3000, **{"scheme.collectors": 2, "env.kwargs": {"p": 1.0},
                                                 "scheme.max_restarts": 3})
    with pytest.raises(TrainingError, match=r"restarted 3 times.*simulator crashed"):
        run_in_process(L)


def test_a_bad_config_in_a_collector_is_a_user_error_not_a_restart_in_process():
    L = learner(**{"scheme.collectors": 2})
    L.cfg.env.kwargs = {"no_such_kwarg": 1}  # the learner's env was fine; the collectors' are not
    with pytest.raises(UserError, match="no_such_kwarg"):
        run_in_process(L)


def test_killing_a_collector_mid_run_loses_nothing(ray_local, tmp_path):
    L = learner("dqn", "CartPole-v1", steps=4096, run_dir=tmp_path,
                **{"scheme.collectors": 2, "scheme.collect": "async", "env.num_envs": 2,
                   "dqn.learning_starts": 256, "dqn.hidden": [16], "checkpoint.every": 1024})
    scheme, killed = ray_scheme_killing(L, ray_local, "collector")
    summary = L.train()
    assert killed and summary["env_steps"] == 4096
    assert scheme.restarts >= 1 and scheme.dropped >= 1
    assert L.algo.replay.steps_added * 2 == 4096
    state = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    assert state["counters"]["env_steps"] == 4096
    assert state["algo"]["replay"]["steps"] * 2 == 4096
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert any('"collector_restarts": 1' in line or '"collector_restarts": 2' in line for line in lines)


# ---------------------------------------------------------------------------
# checkpoints move between schemes


@pytest.mark.parametrize("algo,extra", [
    # schedules that do not depend on the run's length (N and 2N runs share them)
    ("ppo", {"ppo.n_epochs": 2, "ppo.batch_size": 64, "ppo.lr_schedule": "constant", "ppo.clip_schedule": "constant"}),
    # each collector's recurrent state goes into the checkpoint with its env state
    ("ppo_lstm", {"ppo_lstm.n_epochs": 2, "ppo_lstm.batch_size": 64, "ppo_lstm.n_steps": 32, "ppo_lstm.seq_len": 16,
                  "ppo_lstm.core_size": 16}),
    ("dqn", {"dqn.learning_starts": 128, "dqn.hidden": [16], "dqn.train_freq": 4, "dqn.gradient_steps": 2,
             "dqn.exploration_initial_eps": 0.2, "dqn.exploration_final_eps": 0.2}),
])
def test_a_distributed_run_resumed_from_its_checkpoint_equals_one_that_never_stopped_in_process(
        tmp_path, algo, extra):
    # Sync collection with 2 collectors in this process: each collector's env state and
    # action stream go into the checkpoint, so N + resume N is 2N bit for bit, episodes and all.
    over = {"scheme.collectors": 2, "env.num_envs": 2, "checkpoint.every": 10**9, **extra}
    n = 2 * 2 * 2 * learner(algo, steps=1, **over).algo.fragment_length() * 2

    def params(L):
        return torch.cat([p.detach().flatten() for p in L.algo.actor.parameters()])

    full = learner(algo, steps=2 * n, run_dir=tmp_path / "full", **over)
    run_in_process(full)
    half = learner(algo, steps=n, run_dir=tmp_path / "half", **over)
    run_in_process(half)
    state = load_checkpoint(tmp_path / "half" / "checkpoints" / "latest.pt")
    assert len(state["collectors"]) == 2 and all(c["env"] is not None for c in state["collectors"])
    rest = learner(algo, steps=2 * n, run_dir=tmp_path / "rest", **over)
    rest.load_state_dict(state)
    run_in_process(rest)
    assert rest.env_steps == full.env_steps == 2 * n
    assert torch.equal(params(rest), params(full))
    assert rest.episodes == full.episodes and list(rest.recent_returns) == list(full.recent_returns)


@pytest.mark.parametrize("algo,extra", [
    ("ppo", {"ppo.n_epochs": 1, "ppo.batch_size": 64}),
    ("dqn", {"dqn.learning_starts": 128, "dqn.hidden": [16]}),
])
def test_a_distributed_checkpoint_resumes_in_process_and_back(ray_local, tmp_path, algo, extra):
    from corral.agent import config_from_dict

    run = tmp_path / "run"
    L = learner(algo, steps=1024, run_dir=run, **{"scheme.collectors": 2, "env.num_envs": 2, **extra})
    L.train()

    def resume(collectors, steps):
        state = load_checkpoint(run / "checkpoints" / "latest.pt")
        cfg = config_from_dict(state["config"])
        cfg.steps, cfg.scheme.collectors = steps, collectors
        R = Learner(cfg, run, quiet=True)
        R.load_state_dict(state)
        before = R.env_steps
        summary = R.train()
        return before, summary, R

    before, summary, R = resume(1, 2048)
    assert before == 1024 and summary["env_steps"] == 2048
    before, summary, R = resume(2, 3072)
    assert before == 2048 and summary["env_steps"] == 3072
    assert R.episodes > 0


# ---------------------------------------------------------------------------
# learning


def test_sync_ppo_with_two_ray_collectors_solves_cartpole(ray_local, tmp_path):
    # Each collector runs 4 envs, so a batch (2 x 32 steps x 4 envs) is the in-process preset's 256.
    # Robust by design (Ray workers are separate processes): the run stops at the first periodic
    # deterministic evaluation (10 episodes every 5k steps) of 500, the best evaluation's
    # checkpoint is picked, and the assertion is a held-out evaluation on other seeds
    # (20 episodes) with a margin: >= 450 (random play: ~22).
    agent = corral.train("ppo", "CartPole-v1", steps=150_000, seed=0, run_dir=str(tmp_path / "r"),
                         **{"scheme.collectors": 2, "env.num_envs": 4, "ppo.batch_size": 128,
                            "eval.every": 5_000, "eval.episodes": 10, "eval.stop_at_return": 500,
                            "tensorboard": False})
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_return"]) for r in rows if "eval_return" in r]
    best = corral.load(tmp_path / "r")  # checkpoints/best.pt
    held_out = corral.evaluate(best, "CartPole-v1", episodes=20, seed=123)["mean_return"]
    print(f"\nppo-ray-sync: steps={agent.summary['env_steps']} stopped={agent.summary['stopped_early']} "
          f"best_eval={max(e for _, e in evals):.1f} held_out={held_out:.1f} evals={evals}")
    assert max(e for _, e in evals) >= 475, evals
    assert held_out >= 450, (held_out, evals)
