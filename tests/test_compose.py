"""A run composed from parts in Python (corral.compose): the same run as corral.train, the
parts checked where they are made, a user's actor and storage classes, per-env monitor logs,
the local scheme backend, and envs given as objects recorded so a run dir reloads them."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest
import torch

import corral
from corral.actors import ActorCritic
from corral.errors import UserError
from corral.storage import STORAGES, RolloutStorage

QUIET = {"eval.episodes": 0, "tensorboard": False, "progress": False}
SMALL = {"n_steps": 32, "batch_size": 64, "n_epochs": 2}


def make_cartpole(max_episode_steps: int = 500):
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


class WideActor(ActorCritic):
    """A user's actor-critic: ActorCritic's interface, its own hidden sizes."""

    def __init__(self, obs_space, act_space, cfg):
        super().__init__(obs_space, act_space, hidden=(17,), activation="tanh", normalize_obs=False)


class NotAnActor(torch.nn.Module):
    def __init__(self, obs_space, act_space, cfg):
        super().__init__()


class MarkedStorage(RolloutStorage):
    pass


def params(algo) -> list[torch.Tensor]:
    return [p.detach().clone() for p in algo.actor.parameters()]


def test_a_composed_run_is_the_same_run_as_corral_train():
    scheme = corral.Scheme(corral.VecEnvFactory("CartPole-v1", num_envs=4), corral.AlgoFactory("ppo", lr=1e-3, **SMALL))
    learner = corral.Learner.from_scheme(scheme, steps=2048, seed=3, use_preset=True, **QUIET)
    composed = learner.train()
    agent = corral.train("ppo", "CartPole-v1", steps=2048, seed=3, save_run=False,
                         **{**SMALL, "lr": 1e-3, "env.num_envs": 4, **QUIET})
    assert learner.cfg.algo_cfg == agent.cfg.algo_cfg and learner.cfg.algo_cfg.gamma == 0.98  # the preset's
    assert composed["episodes"] == agent.summary["episodes"] > 0
    for a, b in zip(params(learner.algo), params(agent.algo)):
        assert torch.equal(a, b)


def test_parts_are_checked_where_they_are_made_naming_the_thing():
    with pytest.raises(UserError, match="ppo.lrr"):
        corral.AlgoFactory("ppo", lrr=1e-3)
    with pytest.raises(UserError, match="ppo.lr"):
        corral.AlgoFactory("ppo", lr=-1.0)
    with pytest.raises(UserError, match="unknown algorithm"):
        corral.AlgoFactory("ppoo")
    with pytest.raises(UserError, match="num_envs"):
        corral.VecEnvFactory("CartPole-v1", num_envs=0)
    with pytest.raises(UserError, match="env_fn"):
        corral.VecEnvFactory(42)
    with pytest.raises(UserError, match="backend"):
        corral.VecEnvFactory("CartPole-v1", backend="threads")
    envs, algo = corral.VecEnvFactory("CartPole-v1"), corral.AlgoFactory("ppo")
    with pytest.raises(UserError, match="scheme.collectors"):
        corral.Scheme(envs, algo, collectors=0)
    with pytest.raises(UserError, match="scheme.grad"):
        corral.Scheme(envs, algo, grad="sometimes")
    with pytest.raises(UserError, match="AlgoFactory"):
        corral.Scheme(envs, "ppo")
    with pytest.raises(UserError, match="Scheme"):
        corral.Learner.from_scheme(algo, steps=10)


def test_the_parts_pickle_for_workers_and_build_alone():
    envs = corral.VecEnvFactory(make_cartpole, {"max_episode_steps": 50}, num_envs=3)
    algo = corral.AlgoFactory("ppo", lr=1e-3, **SMALL)
    scheme = pickle.loads(pickle.dumps(corral.Scheme(envs, algo, collectors=2)))
    assert scheme.settings()["scheme.collectors"] == 2 and scheme.algo.options["lr"] == 1e-3
    venv = scheme.envs(seed=0)
    try:
        assert venv.num_envs == 3
        obs_space, act_space = scheme.envs.spaces()
        built = scheme.algo(obs_space, act_space, num_envs=3)
        assert built.storage.data.obs.shape[:2] == (32, 3) and built.cfg.lr == 1e-3
    finally:
        venv.close()


def test_a_users_actor_class_is_the_actor_and_round_trips_through_a_run_dir(tmp_path):
    scheme = corral.Scheme(corral.VecEnvFactory(make_cartpole, num_envs=2),
                           corral.AlgoFactory("ppo", actor=WideActor, storage=MarkedStorage, **SMALL))
    learner = corral.Learner.from_scheme(scheme, steps=256, run_dir=str(tmp_path / "run"), **QUIET)
    learner.train()
    assert type(learner.algo.actor) is WideActor and type(learner.algo.storage) is MarkedStorage
    assert learner.cfg.algo_cfg.actor == "test_compose:WideActor"
    assert learner.cfg.env.id == "test_compose:make_cartpole"  # recorded by name: the run dir rebuilds it
    agent = corral.load(tmp_path / "run")
    assert type(agent.algo.actor) is WideActor
    obs = torch.randn(16, 4).numpy()
    expect = learner.algo.act(torch.as_tensor(obs)).numpy()
    assert (agent.act(obs) == expect).all()
    assert corral.evaluate(agent, episodes=2)["episodes"] == 2  # its env, rebuilt from the config


def test_bad_actor_and_storage_classes_are_refused_with_the_fix():
    with pytest.raises(UserError, match="ActorCritic's interface"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, actor=NotAnActor, **SMALL)
    with pytest.raises(UserError, match=r"called as \(obs_space, act_space, config\)"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, actor=torch.nn.Tanh, **SMALL)
    with pytest.raises(UserError, match="both set"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, actor=WideActor, features="mlp", **SMALL)
    with pytest.raises(UserError, match="subclass of corral.storage.rollout.RolloutStorage"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, storage=WideActor, **SMALL)
    with pytest.raises(UserError, match="register_storage"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, storage="nonesuch", **SMALL)
    with pytest.raises(UserError, match="make_actor"):
        corral.train("ppo_lstm", "CartPole-v1", steps=64, save_run=False, actor=WideActor)
    with pytest.raises(UserError, match="make_actor"):
        corral.train("ppo_rnd", "CartPole-v1", steps=64, save_run=False, actor=WideActor)


def test_a_registered_storage_is_taken_by_name_from_the_cli(tmp_path, capsys):
    from corral.cli import main

    corral.register_storage("marked", MarkedStorage)
    try:
        assert main(["train", "ppo", "CartPole-v1", "--steps", "128", "--run-dir", str(tmp_path / "r"),
                     "--set", "ppo.storage=marked", "--set", "ppo.n_steps=32", "--set", "ppo.batch_size=64",
                     "--set", "eval.episodes=0", "--json"]) == 0
        assert "storage: marked" in (tmp_path / "r" / "config.yaml").read_text()
    finally:
        STORAGES.pop("marked")


def test_builtin_feature_extractors_by_name():
    agent = corral.train("ppo", "CartPole-v1", steps=64, save_run=False, features="mlp", **SMALL, **QUIET)
    assert agent.algo.actor.extractor.out_dim == 64
    assert agent.algo.actor.body.weights[0].shape[-1] == 64


def test_the_local_backend_runs_two_collectors_in_process_with_their_monitor_logs(tmp_path):
    envs = corral.VecEnvFactory("CartPole-v1", num_envs=2, log_dir=str(tmp_path / "monitor"))
    scheme = corral.Scheme(envs, corral.AlgoFactory("ppo", **SMALL), collectors=2, backend="local")
    learner = corral.Learner.from_scheme(scheme, steps=1024, **QUIET)
    summary = learner.train()
    assert summary["env_steps"] == 1024
    logs = sorted((tmp_path / "monitor").glob("*.monitor.csv"))
    assert [p.name for p in logs] == ["c0.monitor.csv", "c1.monitor.csv"]  # one per collector
    rows = [len(p.read_text().splitlines()) - 2 for p in logs]
    assert min(rows) > 0 and sum(rows) == learner.episodes
