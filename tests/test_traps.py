"""Correctness and resume traps: devices at resume, schedules under a larger budget, what
best.pt / step-*.pt hold, target networks and the observation normalizer, and the Ape-X
replay server's state in mid-run checkpoints."""

import types

import gymnasium as gym
import pytest
import torch

from corral.algos import get_algo
from corral.rng import RNGStreams

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def make(algo, env_id="CartPole-v1", num_envs=1, **overrides):
    env = gym.make(env_id)
    spec = get_algo(algo)
    cfg = spec.cls.Config()
    for k, v in {**spec.overrides, **overrides}.items():
        setattr(cfg, k, v)
    a = spec.cls(cfg, env.observation_space, env.action_space, num_envs, torch.device("cpu"), RNGStreams(0))
    a.total_steps = 1000
    return a


# ---------------------------------------------------------------------------
# 4. targets normalize with the online normalizer's current statistics


@pytest.mark.parametrize("algo", ["dqn", "double_dqn", "apex_dqn"])
def test_dqn_target_scores_next_obs_with_the_online_normalizers_current_statistics(algo):
    a = make(algo, normalize_obs=True, hidden=(16,))
    g = torch.Generator().manual_seed(1)
    a.actor.enc.norm.update(3.0 + 2.0 * torch.randn(256, 4, generator=g))  # moved since the target's copy
    next_obs = torch.randn(8, 4, generator=g)
    expect = a.target(a.actor.enc(next_obs))  # target weights on online-normalized observations
    assert not torch.allclose(a.target.q(next_obs), expect)  # the target's own (stale) normalizer
    with torch.no_grad():
        got = a.shared_targets(types.SimpleNamespace(next_obs=next_obs))
    torch.testing.assert_close(got, expect, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# 3. best.pt and step-*.pt are for acting; latest.pt keeps the replay for resume


def test_best_and_step_checkpoints_leave_the_replay_out_and_latest_keeps_it(tmp_path, capsys):
    import corral
    from corral.cli import main
    from corral.train.checkpoint import load_checkpoint

    run = tmp_path / "run"
    args = ["train", "dqn", "CartPole-v1", "--steps", "1200", "--run-dir", str(run), "--json"]
    for kv in ("tensorboard=false", "learning_starts=200", "buffer_size=20000", "hidden=[16]", "eval.every=400",
               "eval.episodes=1", "checkpoint.every=400", "checkpoint.keep=5"):
        args += ["--set", kv]
    assert main(args) == 0
    ck = run / "checkpoints"
    steps = sorted(ck.glob("step-*.pt"))
    assert steps and (ck / "best.pt").is_file()
    latest = load_checkpoint(ck / "latest.pt")
    assert "replay" in latest["algo"]
    for path in [ck / "best.pt", *steps]:
        state = load_checkpoint(path)
        assert "replay" not in state["algo"]
        assert set(state["algo"]) == set(latest["algo"]) - {"replay"}
        assert path.stat().st_size * 10 < (ck / "latest.pt").stat().st_size
    agent = corral.load(ck / "best.pt", device="cpu")
    assert agent.act(torch.zeros(4).numpy()).shape == ()
    capsys.readouterr()
    assert main(["eval", str(steps[-1]), "--episodes", "1", "--device", "cpu", "--json"]) == 0
    assert main(["eval", str(run), "--episodes", "1", "--device", "cpu", "--json"]) == 0  # the run's best.pt
