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


# ---------------------------------------------------------------------------
# 2. resume --steps N with N above the original budget: schedules follow the new budget


def _rows(run):
    import json

    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_resume_with_a_larger_budget_puts_ppos_linear_schedules_on_the_new_budget(tmp_path, capsys):
    from corral.cli import main

    run = _tiny_run(tmp_path, "ppo", 512, ("ppo.n_steps=64", "env.num_envs=2", "ppo.n_epochs=1", "ppo.batch_size=64", "log_every=1",
                                           "ppo.lr_schedule=linear", "ppo.clip_schedule=linear", "ppo.lr=0.001"))
    before = _rows(run)
    assert before[-1]["step"] == 512 and before[-1]["lr"] == 0.0  # annealed to 0 at the old budget
    assert main(["resume", str(run), "--steps", "1024", "--json"]) == 0
    after = [r for r in _rows(run)[len(before):] if "lr" in r]
    assert [r["step"] for r in after] == list(range(640, 1025, 128))
    for r in after:  # what a run launched with 1024 steps has at that step
        assert r["lr"] == pytest.approx(0.001 * (1 - r["step"] / 1024), rel=1e-12, abs=0)
        assert r["clip_range"] == pytest.approx(0.2 * (1 - r["step"] / 1024), rel=1e-12, abs=0)
    text = " ".join(_help(capsys, ["resume", "--help"]).split())
    assert "--steps N sets a new total budget" in text and "progress = env steps / N" in text


def _help(capsys, argv):
    from corral.cli import build_parser

    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    return capsys.readouterr().out


def test_resume_with_a_larger_budget_puts_dqn_epsilon_and_per_beta_on_the_new_budget(tmp_path):
    from corral.agent import config_from_dict
    from corral.train.checkpoint import load_checkpoint
    from corral.train.learner import Learner

    run = _tiny_run(tmp_path, "per_dqn", 512, DQN_TINY + ("log_every=1", "exploration_fraction=0.5",
                                                          "exploration_initial_eps=1.0", "exploration_final_eps=0.1"))
    before = _rows(run)
    assert before[-1]["epsilon"] == pytest.approx(0.1)  # decayed by 256 steps of the old 512
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    cfg = config_from_dict(state["config"])
    cfg.steps = 2048
    L = Learner(cfg, run, quiet=True)
    L.load_state_dict(state)
    L.train()
    after = [r for r in _rows(run)[len(before):] if "epsilon" in r]
    assert after and after[0]["step"] < 1024
    for r in after:  # decays over exploration_fraction x the new budget: back up at the resume point
        assert r["epsilon"] == pytest.approx(1.0 + min(1.0, r["step"] / 1024) * (0.1 - 1.0), rel=1e-12)
    assert after[0]["epsilon"] > 0.3  # it had reached 0.1
    # PER beta anneals over the new budget: at the first update after the resume point it is
    # 0.4 + 0.6 * env_steps / 2048 (it was 1.0 at the old budget's end)
    R = Learner(cfg, None, quiet=True)
    R.load_state_dict(state)
    next(R.stream())
    replay = R.algo.replay
    assert replay.beta_steps == 2048 and replay.step - 1 == R.env_steps > 512  # step counts the draw made
    replay.step -= 1
    assert replay.beta == pytest.approx(0.4 + 0.6 * R.env_steps / 2048, rel=1e-12)


# ---------------------------------------------------------------------------
# 5. an Ape-X run's mid-run checkpoint holds the replay server's whole state


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


def _same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("learner_on_another_device", [False, True])
def test_a_mid_run_apex_checkpoint_holds_the_replay_servers_whole_state_and_resume_restores_it(
        tmp_path, monkeypatch, learner_on_another_device):
    """``learner_on_another_device``: the learner's own buffer cannot hold the server's CPU
    generator state (a learner on a GPU, simulated here by a generator that refuses it); the
    server must still resume on its saved sampling stream."""
    import shutil

    from corral.schemes.fragments import FragmentScheme
    from corral.schemes.replay_server import ReplayClient
    from corral.train.checkpoint import load_checkpoint
    from corral.train.learner import Learner
    from corral.train.setup import build_config, new_run_dir

    over = {**QUIET, "scheme.collectors": 2, "env.num_envs": 2, "learning_starts": 512, "train_freq": 4,
            "gradient_steps": 2, "hidden": [16], "prefetch": 4, "batch_size": 32, "buffer_size": 8192,
            "rollout_fragment": 32, "checkpoint.every": 1536, "normalize_obs": True}
    cfg = build_config("apex_dqn", "CartPole-v1", steps=3072, overrides=over)
    L = Learner(cfg, new_run_dir(cfg, str(tmp_path / "run")), quiet=True)
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    seen = {}
    save = L.save

    def spy(path, replay=True):
        out = save(path, replay)
        client = L.algo.replay
        if path.name == "latest.pt" and isinstance(client, ReplayClient) and not seen:
            shutil.copy(path, tmp_path / "mid.pt")
            server = client.server  # what the server holds right after the checkpoint was written
            seen["buffer"] = _clone(server.buffer.state_dict())
            seen["order"] = server._order.get_state().clone()
            seen["queue"] = [_clone(vars(b)) for b in client._queue]
            handle = client._next[0] if client._next is not None else None
            seen["next"] = None if handle is None else _clone(vars(getattr(handle, "value", handle)))
            seen["env_steps"] = L.env_steps
        return out

    L.save = spy
    L.train()
    assert seen and 1536 <= seen["env_steps"] < 3072 and seen["queue"]

    mid = load_checkpoint(tmp_path / "mid.pt")
    if learner_on_another_device:
        import corral.storage.replay_state as replay_state
        from corral.rng import set_generator_state

        calls = []

        def learner_first(gen, state):  # the learner's buffer loads first and reseeds, as a cuda one does
            calls.append(gen)
            return set_generator_state(gen, state[:16] if len(calls) == 1 else state)

        monkeypatch.setattr(replay_state, "set_generator_state", learner_first)
    replay = mid["algo"]["replay"]
    server_part = replay["server"]
    _same({k: v for k, v in replay.items() if k != "server"}, seen["buffer"], "replay")  # rows, tree, beta step, RNG
    assert torch.equal(server_part["order"], seen["order"])
    _same(server_part["client"]["queue"], seen["queue"], "queue")
    _same(server_part["client"]["next"], seen["next"], "next")

    R = Learner(cfg, tmp_path / "run", quiet=True)
    R.load_state_dict(mid)
    again = FragmentScheme(R)
    again.start()  # collectors and the replay server, as a resumed run starts them
    try:
        client = R.algo.replay
        assert isinstance(client, ReplayClient) and len(client) == len(R.algo.replay.server.buffer)
        _same(client.server.buffer.state_dict(), seen["buffer"], "restored")
        assert torch.equal(client.server._order.get_state(), seen["order"])
        _same([vars(b) for b in client._queue], seen["queue"], "restored queue")
        _same(vars(client._next[0].value), seen["next"], "restored next")
    finally:
        again.close()
    R = Learner(cfg, tmp_path / "run", quiet=True)  # and the resumed run trains on to its budget
    R.load_state_dict(mid)
    R.make_stream = FragmentScheme(R).stream
    assert R.train()["env_steps"] == 3072
