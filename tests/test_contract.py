"""The algorithm contract (``corral/algos/base.py``, ``docs/algorithms.md``): declarations,
roles, hooks, the PPO family's one update loop, and the run bookkeeping every loop shares.

Each test of a fix named in the contract issue fails on the code before it (noted per test)."""

import functools
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.algos import ALGOS as REGISTRY
from corral.algos import get_algo
from corral.algos.base import Step, index_record, stack_records
from corral.algos.ppo import normalized
from corral.rng import RNGStreams
from corral.schemes.collector import Collector, FragmentData, FragmentMeta, driver_paths
from corral.schemes.fragments import FragmentScheme
from corral.train.learner import Learner
from corral.train.setup import build_config, new_run_dir

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}
BOX = gym.spaces.Box(-1, 1, (4,), np.float32)
D2 = gym.spaces.Discrete(2)
B2 = gym.spaces.Box(-1, 1, (2,), np.float32)
SMALL_REPLAY = {"buffer_size": 64}
SMALL_NETS = {"buffer_size": 64, "hidden": (16,)}
# Multi-agent algorithms read the agent layout packed into the observation space, so theirs come
# from a small env through the multi-agent vector env (built on first use: PettingZoo is an extra).
MA_DISCRETE = "corral.envs.matrix_games:TwoStepGame"
MA_BOX = "ma_envs:TargetsEnv"
ALGOS = {  # name: (obs space or multi-agent env spec, action space or None, config overrides)
    "ppo": (BOX, D2, {}),
    "ppo_lstm": (BOX, D2, {}),
    "ppo_rnd": (BOX, D2, {}),
    "ppo_icm": (BOX, D2, {}),
    "impala": (BOX, D2, {}),
    "impala_lstm": (BOX, D2, {}),
    "appo": (BOX, D2, {}),
    "a2c": (BOX, D2, {}),
    "reinforce": (BOX, B2, {}),
    "trpo": (BOX, D2, {}),
    "ars": (BOX, D2, {}),
    **{name: (BOX, D2, SMALL_REPLAY)
       for name in ("dqn", "double_dqn", "dueling_dqn", "d3qn", "noisy_dqn", "per_dqn", "per_double_dqn",
                    "per_d3qn", "apex_dqn", "c51", "qrdqn", "iqn", "rainbow", "mdqn", "apex_rainbow",
                    "sac_discrete", "drqn", "r2d2", "ngu", "agent57")},
    **{name: (BOX, B2, SMALL_REPLAY) for name in ("sac", "td3", "ddpg", "apex_td3", "apex_ddpg")},
    **{name: (BOX, B2, SMALL_NETS) for name in ("redq", "droq", "tqc")},
    "crossq": (BOX, B2, {**SMALL_NETS, "critic_hidden": (16,)}),
    "mappo": (MA_DISCRETE, None, {}),
    "ippo": (MA_DISCRETE, None, {}),
    "qmix": (MA_DISCRETE, None, SMALL_REPLAY),
    "vdn": (MA_DISCRETE, None, SMALL_REPLAY),
    "maddpg": (MA_BOX, None, SMALL_REPLAY),
    "matd3": (MA_BOX, None, SMALL_REPLAY),
}


@functools.cache
def multiagent_spaces(spec):
    pytest.importorskip("pettingzoo")
    from corral.envs.multiagent import make_multiagent_vec_env

    env = make_multiagent_vec_env(spec, 1)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def spaces(name):
    obs_space, act_space, _ = ALGOS[name]
    return multiagent_spaces(obs_space) if isinstance(obs_space, str) else (obs_space, act_space)


def build(name, role="learner", seed=0, **over):
    obs_space, act_space = spaces(name)
    spec = get_algo(name)
    cfg = spec.cls.Config(**{**spec.overrides, **ALGOS[name][2], **over})
    return spec.cls(cfg, obs_space, act_space, 2, torch.device("cpu"), RNGStreams(seed), role=role)


def learner(algo="ppo", env="CartPole-v1", steps=2048, run_dir=None, **overrides):
    cfg = build_config(algo, env, steps=steps, overrides={**QUIET, **overrides})
    return Learner(cfg, new_run_dir(cfg, str(run_dir)) if run_dir else None, env_spec=env, quiet=True)


# ---------------------------------------------------------------------------
# declarations and roles


def test_the_contract_table_covers_every_registry_name():
    assert sorted(set(REGISTRY) - set(ALGOS)) == []
    assert sorted(set(ALGOS) - set(REGISTRY)) == []  # no stale names either


@pytest.mark.parametrize("name", list(ALGOS))
def test_state_and_synced_tensors_come_from_the_declarations(name):
    algo = build(name)
    state = algo.state_dict()
    for attr in algo.networks + algo.free_params:
        assert attr in state, attr
    for attr in algo.optimizers:
        assert (attr in state) == (getattr(algo, attr) is not None), attr
    declared = sum(len(list(n.parameters())) + len(list(n.buffers())) for n in algo.declared_networks())
    assert len(algo.synced_tensors()) == declared + len(algo.free_params)
    # every module and optimizer the algorithm holds is declared (nothing is found by scanning)
    held = {k for k, v in vars(algo).items() if isinstance(v, torch.nn.Module) or hasattr(v, "flat")}
    assert held <= set(algo.networks) | set(algo.optimizers)


@pytest.mark.parametrize("name", list(ALGOS))
def test_an_acting_copy_has_no_storage_and_no_optimizers_and_acts_like_the_learner(name):
    full = build(name, seed=3)
    with torch.no_grad():
        for p in full.actor.parameters():
            p.add_(0.1)  # not the init weights: the copy must take them from the state
    actor = build(name, role="actor", seed=5)
    assert actor.declared_optimizers() == []
    assert getattr(actor, "replay", None) is None and getattr(actor, "storage", None) is None
    actor.load_state_dict(full.state_dict())
    obs = torch.randn(6, *spaces(name)[0].shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(actor.policy()(obs), full.policy()(obs), rtol=0, atol=0)
    assert set(actor.state_dict()) <= set(full.state_dict())


# ARS is derivative-free (random search over the weights): it has no optimizer and no gradient,
# so a gradient worker, whose job is to compute and apply gradients, does not apply to it.
NO_GRADIENT = {"ars"}


@pytest.mark.parametrize("name", list(ALGOS))
def test_a_gradient_worker_has_the_learners_optimizers_but_stores_nothing(name):
    if name in NO_GRADIENT:
        pytest.skip(f"{name} takes no gradient steps: it has no optimizer to hold")
    w = build(name, role="grad_worker")
    assert getattr(w, "storage", None) is None and getattr(w, "replay", None) is None
    learner_optimizers = build(name).declared_optimizers()
    assert len(w.declared_optimizers()) == len(learner_optimizers) >= 1


def test_a_gradient_worker_skips_the_rollout_size_check():
    w = build("ppo", role="grad_worker", batch_size=4096)  # no rollout: the size check does not apply
    assert w.storage is None and len(w.declared_optimizers()) == 1
    w = build("sac", role="grad_worker")
    assert w.replay is None and len(w.declared_optimizers()) == 3


def test_a_subclass_changes_the_network_through_its_factory_alone():
    from corral.algos.dqn import DQN

    class WideDQN(DQN):
        def make_q_network(self):
            self.cfg.hidden = (7,)
            return super().make_q_network()

    obs_space, act_space, base = ALGOS["dqn"]
    algo = WideDQN(WideDQN.Config(**base), obs_space, act_space, 2, torch.device("cpu"), RNGStreams(0))
    assert {p.shape[0] for p in algo.actor.parameters() if p.dim() == 2} == {7, 2}
    assert [p.shape for p in algo.target.parameters()] == [p.shape for p in algo.actor.parameters()]


def test_no_scheme_or_loop_probes_an_algorithm():
    """Schemes, the Learner and checkpoints call declared hooks; none asks an algorithm what
    it has (``hasattr``/``getattr`` on it, or ``vars()``)."""
    root = Path(__file__).resolve().parent.parent / "corral"
    probe = re.compile(r"(hasattr|getattr)\((self\.)?(learner\.|L\.)?algo\b|vars\(self\)|hasattr\(algo_cfg")
    hits = [f"{p.relative_to(root)}:{i}" for d in ("schemes", "train", "algos") for p in (root / d).glob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert hits == []


def test_extras_records_stack_and_index_back():
    algo = build("ppo")
    records = [algo.explore(torch.randn(2, 4))[1] for _ in range(3)]
    stacked = stack_records(records)
    assert type(stacked).__name__ == "PPOExtras" and stacked.action.shape == (3, 2)
    for t in range(3):
        for a, b in zip(index_record(stacked, t), records[t]):
            assert torch.equal(a, b)


# ---------------------------------------------------------------------------
# the PPO family's update loop


def filled(name="ppo", T=8, N=2, **over):
    algo = build(name, n_steps=T, **over)
    g = torch.Generator().manual_seed(1)
    no = torch.zeros(N, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(T):
            obs = torch.randn(N, 4, generator=g)
            _, ex = algo.explore(obs)
            algo.observe(Step(obs, ex, torch.randn(N, generator=g), no, no, obs, torch.randn(N, 4, generator=g)))
    return algo


def test_the_last_partial_minibatch_is_used():
    # 16 transitions in minibatches of 6: 6, 6 and 4 (the old loop dropped the 4: 2 steps per epoch)
    algo = filled(batch_size=6, n_epochs=2)
    stats = algo.update(0.0)
    assert stats["minibatches"] == 6 and algo.optimizer.steps == 6


def test_advantage_normalisation_is_safe_for_a_minibatch_of_one():
    assert normalized(torch.tensor([3.0])).item() == 0.0
    torch.testing.assert_close(normalized(torch.tensor([1.0, 3.0])), torch.tensor([-1.0, 1.0]) / 2 ** 0.5)
    algo = filled(batch_size=5, n_epochs=1)  # 5, 5, 5, 1: the old code's std of one sample was NaN
    stats = algo.update(0.0)
    assert stats["minibatches"] == 4 and np.isfinite(stats["pg_loss"])
    assert all(torch.isfinite(p).all() for p in algo.actor.parameters())


def test_target_kl_stops_before_the_step_that_overshoots():
    # The first minibatch's ratio is exactly 1 (KL 0): it steps. The second sees the moved policy,
    # KL > 1.5 * 1e-12, and the loop stops before its step (the old loop took it, then stopped).
    algo = filled(batch_size=4, n_epochs=1, target_kl=1e-12, lr=1e-2)
    stats = algo.update(0.0)
    assert algo.optimizer.steps == 1 and stats["minibatches"] == 1
    assert stats["approx_kl"] > 0  # the stopping minibatch's KL is reported


def test_impala_bootstraps_with_the_current_network_in_every_minibatch():
    algo = filled("impala", batch_size=8, n_epochs=2)  # columns one at a time: 2 per epoch, 4 in all
    seen = []
    inner = algo.bootstrap_value

    def spy(obs):
        seen.append((algo.optimizer.flat.clone(), inner(obs)))
        return seen[-1][1]

    algo.bootstrap_value = spy
    algo.update(0.0)
    assert len(seen) == 4
    params = [p for p, _ in seen]
    assert all(not torch.equal(a, b) for a, b in zip(params, params[1:]))  # a step between every two


def test_a_native_run_goes_through_the_same_learner_and_update_loop():
    L = learner("ppo", "native:CartPole-v1", steps=32, **{"env.num_envs": 4, "ppo.n_steps": 8,
                                                           "ppo.batch_size": 24, "ppo.n_epochs": 2})
    assert L.device_resident
    stats = next(L.stream())
    assert stats["minibatches"] == 4 and L.algo.optimizer.steps == 4  # 32 transitions in 24 + 8, twice


# ---------------------------------------------------------------------------
# reward scaling follows the env's episodes, not fragments


def fragment(algo, T, N, seed, worker, version=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, N, 4, generator=g)
    with torch.no_grad():
        extras = stack_records([algo.explore(obs[t])[1] for t in range(T)])
    no = torch.zeros(T, N, dtype=torch.bool)
    data = FragmentData(obs, extras, torch.ones(T, N), no, no.clone(), obs.new_empty((0, 4)))
    return FragmentMeta(worker, 0, version, T * N, 1.0), data


def test_reward_scaling_is_not_reset_at_fragment_boundaries_and_follows_each_collector():
    L = learner("ppo", steps=10**6, **{"ppo.normalize_reward": True, "ppo.n_steps": 4, "ppo.batch_size": 8,
                                       "env.num_envs": 2, "scheme.collectors": 2})
    scheme = FragmentScheme(L)
    scheme.setup_learner()
    algo = L.algo
    gamma = algo.cfg.gamma
    scheme.consume(*fragment(algo, 4, 2, 0, worker=0))
    after0 = algo._disc_return.clone()
    # four rewards of 1 with no episode end: the discounted return runs on over the boundary
    # (the old code zeroed it on the fragment's last step, where `truncated` marks the boundary)
    expected = sum(gamma ** k for k in range(4))
    torch.testing.assert_close(after0, torch.full((2,), expected))
    scheme.consume(*fragment(algo, 4, 2, 1, worker=1))  # collector 1's own episodes start at 0
    torch.testing.assert_close(algo._disc_return, torch.full((2,), expected))
    scheme.consume(*fragment(algo, 4, 2, 2, worker=0))  # collector 0 continues where it stopped
    torch.testing.assert_close(algo._disc_return, torch.full((2,), sum(gamma ** k for k in range(8))))


# ---------------------------------------------------------------------------
# bookkeeping: one count of steps and whole episodes for every loop


def run_in_process(L):
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    return L.train()


def test_collectors_count_whole_episodes_not_lost_lives_in_process():
    # Fails on the old collectors: every lost life (terminated) was counted as an episode.
    L = learner("ppo", "envs_for_tests:LivesEnv", steps=2 * 2 * 2 * 36,
                **{"scheme.collectors": 2, "env.num_envs": 2, "ppo.n_steps": 36, "ppo.batch_size": 36})
    run_in_process(L)
    assert L.env_steps == 288
    assert L.episodes == 288 // 9  # each env plays whole games of 9 steps
    assert set(L.recent_returns) == {9.0}


def test_in_process_and_distributed_runs_count_the_same_episodes():
    a = learner("ppo", "envs_for_tests:LivesEnv", steps=288, **{"env.num_envs": 2, "ppo.n_steps": 36,
                                                                  "ppo.batch_size": 36})
    a.train()
    assert a.episodes == 32 and set(a.recent_returns) == {9.0}


def test_collectors_build_the_runs_env_with_its_error_policy():
    # Fails on the old collectors, which built a plain env (on_error=raise) whatever the run said.
    cfg = build_config("ppo", "envs_for_tests:make_count_env", steps=1000,
                       overrides={**QUIET, "env.kwargs": {"length": 50, "bad_step": 3, "bad": "raise"},
                                  "env.on_error": "restart", "env.num_envs": 2, "ppo.n_steps": 8,
                                  "ppo.batch_size": 16})
    c = Collector(cfg, "envs_for_tests:make_count_env", 0, 1, paths=driver_paths())
    meta, data = c.collect(None, 0)
    assert data.length == 8 and c.env.restarts >= 1


def test_collectors_build_atari_envs_with_the_runs_wrappers():
    # Fails on the old collectors, which always preprocessed Atari (84x84 frame stacks)
    pytest.importorskip("ale_py")
    L = learner("ppo", "ALE/Pong-v5", steps=1000, **{"env.num_envs": 1, "ppo.n_steps": 8, "ppo.batch_size": 8,
                                                    "env.atari_wrappers": False})
    c = Collector(L.cfg, "ALE/Pong-v5", 0, 1, paths=driver_paths())
    try:
        assert c.spaces() == (L.env.single_observation_space, L.env.single_action_space)
        assert c.spaces()[0].shape == (210, 160, 3)
    finally:
        c.close()
        L.env.close()
