"""Gradient workers for the replay algorithms (DQN family with C51, QR-DQN, IQN, noisy nets
and Munchausen, DDPG, TD3, SAC, REDQ, DroQ, TQC, Ape-X DQN; CrossQ refuses them):
sync sharding gives the single-process updates (every phase: critics, actor, temperature;
PER priorities; targets), async applies whole steps as they land, and a run with Ray
gradient workers trains to the same parameters as one process."""

import copy

import pytest
import torch

from corral.algos.base import Step
from corral.algos.offpolicy import OffPolicy
from corral.rng import RNGStreams
from corral.schemes.grad import LocalGradPool, ShardedOffPolicy, sharded_class
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}

CASES = {
    # Double + dueling + n-step + PER, the target net's Q shared across an update in-process
    "dqn": ("dqn", "CartPole-v1", {"dqn.double": True, "dqn.dueling": True, "dqn.n_step": 3,
                                   "dqn.prioritized": True, "dqn.gradient_steps": 3, "dqn.train_freq": 4,
                                   "dqn.hidden": [32, 32], "dqn.max_grad_norm": 10.0}),
    # twin critics, delayed actor (two steps per update, so the actor phase runs), smoothing noise
    "td3": ("td3", "Pendulum-v1", {"td3.gradient_steps": 2, "td3.hidden": [32, 32]}),
    # critics, actor, automatic temperature: three optimizers in one step; normalized obs
    "sac": ("sac", "Pendulum-v1", {"sac.gradient_steps": 2, "sac.hidden": [32, 32], "sac.normalize_obs": True,
                                   "sac.prioritized": True}),
    # C51 + noisy nets: the noise the learner draws reaches the workers in the layers' buffers
    "rainbow": ("rainbow", "CartPole-v1", {"rainbow.gradient_steps": 3, "rainbow.train_freq": 4,
                                           "rainbow.hidden": [32, 32], "rainbow.max_grad_norm": 10.0}),
    # the sampled fractions are rows of the batch: each worker gets its rows' taus
    "iqn": ("iqn", "CartPole-v1", {"iqn.gradient_steps": 2, "iqn.double": True, "iqn.hidden": [32, 32],
                                   "iqn.n_taus": 8, "iqn.n_target_taus": 8, "iqn.n_action_taus": 4}),
    "qrdqn": ("qrdqn", "CartPole-v1", {"qrdqn.gradient_steps": 2, "qrdqn.hidden": [32], "qrdqn.n_quantiles": 16,
                                       "qrdqn.prioritized": True}),
    "mdqn": ("mdqn", "CartPole-v1", {"mdqn.gradient_steps": 2, "mdqn.hidden": [32], "mdqn.n_step": 3}),
    # REDQ: the step's critic subset is a row per transition, so every shard takes the same one
    "redq": ("redq", "Pendulum-v1", {"redq.gradient_steps": 2, "redq.policy_delay": 2, "redq.n_critics": 5,
                                     "redq.hidden": [32, 32]}),
    # DroQ: each shard gets its rows' dropout masks
    "droq": ("droq", "Pendulum-v1", {"droq.gradient_steps": 2, "droq.policy_delay": 2, "droq.hidden": [32, 32]}),
    # TQC: the per-row quantile loss and its PER priorities
    "tqc": ("tqc", "Pendulum-v1", {"tqc.gradient_steps": 2, "tqc.hidden": [32, 32], "tqc.n_quantiles": 8,
                                   "tqc.prioritized": True}),
    "apex_dqn": ("apex_dqn", "CartPole-v1", {"apex_dqn.gradient_steps": 2, "apex_dqn.hidden": [32],
                                             "apex_dqn.target_update_interval": 3}),
}


def filled(algo, env, overrides, batch=64):
    """A learner whose replay holds enough for updates (random actions: learning has not started)."""
    key = algo
    cfg = build_config(algo, env, steps=10_000, overrides={**QUIET, **overrides, f"{key}.batch_size": batch,
                                                          f"{key}.learning_starts": 300})
    L = Learner(cfg, None, env_spec=env, quiet=True)
    a, env_, obs = L.algo, L.env, L.obs
    with torch.no_grad():
        while not a.ready():
            act, ex = a.explore(obs)
            nxt, r, te, tr, info = env_.step(act)
            a.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    return L


def twin(L, cls):
    a = cls(L.algo.cfg, L.algo.obs_space, L.algo.act_space, L.algo.num_envs, torch.device("cpu"), RNGStreams(0))
    a.load_state_dict(copy.deepcopy(L.algo.state_dict()))
    return a


def assert_same_state(a: OffPolicy, b: OffPolicy, **tol):
    for x, y in zip(a.synced_tensors(), b.synced_tensors(), strict=True):
        torch.testing.assert_close(x, y, **tol)
    for oa, ob in zip(a.declared_optimizers(), b.declared_optimizers(), strict=True):
        torch.testing.assert_close(oa.exp_avg_sq, ob.exp_avg_sq, **tol)
        assert oa.steps == ob.steps


@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_shards_give_the_single_process_updates_in_process(case):
    algo, env, overrides = CASES[case]
    L = filled(algo, env, overrides)
    plain = twin(L, type(L.algo))
    sharded = twin(L, sharded_class(L.algo))
    assert isinstance(sharded, ShardedOffPolicy) and sharded.name == plain.name
    sharded.attach(LocalGradPool(L.cfg, 3, plain.obs_space, plain.act_space), "sync")
    tol = dict(rtol=2e-5, atol=2e-6)
    for _ in range(3):
        s1, s2 = plain.update(0.5), sharded.update(0.5)
        assert s1.keys() == s2.keys()
        for k in s1:
            assert s2[k] == pytest.approx(s1[k], rel=1e-4, abs=1e-6), k
    assert plain.grad_steps == sharded.grad_steps > 0
    assert_same_state(plain, sharded, **tol)
    # the parameters moved (a test that compares two frozen copies would pass as well)
    moved = [not torch.equal(x, y) for x, y in zip(plain.synced_tensors(), twin(L, type(L.algo)).synced_tensors())]
    assert any(moved)
    if plain.cfg.prioritized:  # priorities written back from the shards' TD errors
        torch.testing.assert_close(sharded.replay.priorities, plain.replay.priorities, **tol)


def test_async_steps_land_as_they_arrive_with_their_own_priorities_in_process():
    algo, env, overrides = CASES["dqn"]
    L = filled(algo, env, {**overrides, "dqn.gradient_steps": 4})
    sharded = twin(L, sharded_class(L.algo))
    sharded.attach(LocalGradPool(L.cfg, 2, sharded.obs_space, sharded.act_space), "async")
    before = sharded.replay.priorities.clone()
    sampled = []
    real_step = ShardedOffPolicy._async_step

    def spy(self, batch):
        sampled.append(batch.indices.clone())
        return real_step(self, batch)

    sharded._async_step = spy.__get__(sharded)
    stats = sharded.update(0.5)
    assert sharded.grad_steps == 4 and sharded.declared_optimizers()[0].steps == 4 and not sharded._busy
    # two workers: the first step saw fresh parameters, each later one was one step behind
    assert stats["grad_lag"] == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert {"q_loss", "q_mean", "epsilon"} <= stats.keys()
    changed = (sharded.replay.priorities != before).nonzero().flatten()
    assert set(changed.tolist()) == set(torch.cat(sampled).unique().tolist())


def test_gradient_workers_wire_every_replay_algorithm():
    for algo, env in [("ddpg", "Pendulum-v1"), ("double_dqn", "CartPole-v1"), ("apex_ddpg", "Pendulum-v1")]:
        cfg = build_config(algo, env, overrides={**QUIET, "env.num_envs": 1})
        L = Learner(cfg, None, env_spec=env, quiet=True)
        cls = sharded_class(L.algo)
        assert issubclass(cls, type(L.algo)) and issubclass(cls, ShardedOffPolicy)


def test_sac_with_two_ray_gradient_workers_trains_like_one_process():
    pytest.importorskip("ray")
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    over = {**QUIET, "sac.hidden": [32, 32], "sac.learning_starts": 200, "sac.batch_size": 64}
    runs = []
    init = None
    for workers in (1, 2):
        cfg = build_config("sac", "Pendulum-v1", steps=400, seed=3, overrides={**over, "scheme.grad_workers": workers})
        L = Learner(cfg, None, env_spec="Pendulum-v1", quiet=True)
        init = init or [t.clone() for t in L.algo.synced_tensors()]
        summary = L.train()
        assert summary["env_steps"] == 400
        runs.append(L.algo)
    plain, sharded = runs
    assert isinstance(sharded, ShardedOffPolicy) and plain.grad_steps == sharded.grad_steps == 201
    # 201 steps apart the two differ only by float rounding, which training amplifies a
    # little (~1e-4 here): far less than the parameters moved (~1e-1)
    moved = max((p - i).abs().max().item() for p, i in zip(plain.synced_tensors(), init))
    apart = max((p - s).abs().max().item() for p, s in zip(plain.synced_tensors(), sharded.synced_tensors()))
    assert moved > 0.02 and apart < 0.01 * moved, (moved, apart)
