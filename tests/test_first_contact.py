"""Small things a first-time user meets: a tie between periodic evaluations keeps the later
checkpoint as best.pt."""

from __future__ import annotations

import torch

import corral
from corral.cli import main


def test_a_tied_best_evaluation_keeps_the_later_policy(tmp_path):
    # every policy scores 5 on the count env: three evaluations tie, best.pt is the last one
    run = tmp_path / "run"
    assert main(["train", "ppo", "tests/envs_for_tests.py:CountEnv", "--steps", "192", "--run-dir", str(run),
                 "--set", "ppo.n_steps=32", "--set", "ppo.batch_size=32", "--set", "eval.every=64", "--set", "eval.episodes=2",
                 "--set", "progress=false", "--set", "tensorboard=false"]) == 0
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert best["counters"]["best_eval"] == 5.0
    assert best["counters"]["env_steps"] == 192
    agent = corral.load(run)
    latest = corral.load(run / "checkpoints" / "latest.pt")
    for a, b in zip(agent.actor.state_dict().values(), latest.actor.state_dict().values()):
        assert torch.equal(a, b)


def test_a_local_ray_keeps_few_task_events():
    """corral's local Ray caps the GCS task-event store (Ray's default keeps 100k tasks)."""
    import pytest

    ray = pytest.importorskip("ray")
    from corral.population.tune import ray_session

    if ray.is_initialized():
        pytest.skip("a Ray session is already up in this process")
    with ray_session(1):
        import ray._raylet as raylet

        assert raylet.Config.task_events_max_num_task_in_gcs() == 2000
