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


# ---------------------------------------------------------------------------
# 1. resuming on another device


def _files(run):
    return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _tiny_run(tmp_path, algo="dqn", steps=512, extra=()):
    from corral.cli import main

    run = tmp_path / "run"
    args = ["train", algo, "CartPole-v1", "--steps", str(steps), "--run-dir", str(run), "--json"]
    for kv in ("tensorboard=false", "eval.episodes=0", "progress=false", *extra):
        args += ["--set", kv]
    assert main(args) == 0
    return run


def _cuda_state(seed: int) -> torch.Tensor:
    """What ``torch.Generator("cuda").get_state()`` returns: Philox seed and offset, 16 bytes."""
    return torch.tensor([seed, 4], dtype=torch.int64).view(torch.uint8).clone()


DQN_TINY = ("learning_starts=128", "buffer_size=4096", "hidden=[16]", "batch_size=32")


@pytest.mark.parametrize("on_config", [False, True])
def test_resume_on_a_gpu_that_is_not_there_is_one_user_error_and_leaves_the_run_alone(tmp_path, capsys, monkeypatch,
                                                                                        on_config):
    from corral.cli import main
    from corral.train.checkpoint import load_checkpoint, save_checkpoint

    run = _tiny_run(tmp_path, extra=DQN_TINY)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if on_config:  # a run trained on a GPU, resumed on a machine without one
        ck = run / "checkpoints" / "latest.pt"
        state = load_checkpoint(ck)
        state["config"]["device"] = "cuda"
        save_checkpoint({k: v for k, v in state.items() if k not in ("format", "version")}, ck)
    before = _files(run)
    capsys.readouterr()
    argv = ["resume", str(run), "--steps", "1024"] + ([] if on_config else ["--device", "cuda"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("corral: error:") and "--device cpu" in err[0]
    assert _files(run) == before


def test_generator_states_from_another_device_type_reseed_deterministically():
    from corral.rng import RNGStreams, set_generator_state

    cuda_state = {"device": "cuda", **{n: _cuda_state(i) for i, n in enumerate(("action", "minibatch", "replay", "noise"))}}
    a, b, fresh = RNGStreams(0), RNGStreams(0), RNGStreams(0)
    assert sorted(a.load_state_dict(cuda_state)) == ["action", "minibatch", "noise", "replay"]
    b.load_state_dict(cuda_state)
    draws = [torch.rand(5, generator=a[n]) for n in ("action", "noise")]
    assert all(torch.equal(d, torch.rand(5, generator=b[n])) for d, n in zip(draws, ("action", "noise")))
    assert not torch.equal(draws[0], torch.rand(5, generator=fresh["action"]))  # not the stream's start again
    assert not torch.equal(draws[0], draws[1])  # streams stay distinct
    # a CPU state into a CUDA generator (which, as torch's, refuses a state of another size)
    class CudaLike:
        def set_state(self, s):
            if s.numel() != 16:
                raise RuntimeError("RNG state is wrong size")
            self.state = s

        def manual_seed(self, seed):
            self.seed = seed

    g = CudaLike()
    assert set_generator_state(g, fresh["action"].get_state()) is False and isinstance(g.seed, int)
    assert set_generator_state(g, _cuda_state(3)) is True and torch.equal(g.state, _cuda_state(3))
    same = RNGStreams(0)
    assert same.load_state_dict(fresh.state_dict()) == []  # same device type: loaded exactly


def test_a_checkpoint_from_a_gpu_run_resumes_on_the_cpu_with_a_note(tmp_path, capsys):
    from corral.cli import main
    from corral.train.checkpoint import load_checkpoint, save_checkpoint

    run = _tiny_run(tmp_path, extra=DQN_TINY)
    ck = run / "checkpoints" / "latest.pt"
    state = load_checkpoint(ck)
    # as the GPU run would have written it: its generators were CUDA ones (replay stream included)
    state["rng"] = {"device": "cuda", **{n: _cuda_state(i) for i, n in enumerate(state["rng"]) if n != "device"}}
    state["algo"]["replay"]["generator"] = _cuda_state(99)
    save_checkpoint({k: v for k, v in state.items() if k not in ("format", "version")}, ck)
    capsys.readouterr()
    assert main(["resume", str(run), "--steps", "1024", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr()
    assert '"env_steps": 1024' in out.out
    assert "come from cuda generators" in out.err and "--device cuda" in out.err
