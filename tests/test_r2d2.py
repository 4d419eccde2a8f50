"""R2D2 and DRQN: value rescaling, the sequence window and replay, n-step targets over
sequences, burn-in without gradient, sequence priorities, gradient isolation, exact resume,
the CLI, and learning CartPoleNoVel-v1."""

import json

import pytest
import torch
from conftest import ray_scheme_killing

import corral
from corral.algos.r2d2 import R2D2
from corral.cli import main
from corral.returns import value_rescale, value_unrescale
from corral.rng import RNGStreams
from corral.storage.sequence import SequenceBatch, SequenceReplay, SequenceWindow
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def test_value_rescaling_is_inverted_exactly_and_matches_its_formula():
    x = torch.tensor([-1e4, -123.4, -1.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 77.0, 1e5], dtype=torch.float64)
    torch.testing.assert_close(value_rescale(value_unrescale(x)), x, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(value_unrescale(value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    # h(3) = sqrt(4) - 1 + 0.003; h(-8) = -(sqrt(9) - 1) - 0.008; h(0) = 0
    assert value_rescale(torch.tensor(3.0, dtype=torch.float64)).item() == pytest.approx(1.003)
    assert value_rescale(torch.tensor(-8.0, dtype=torch.float64)).item() == pytest.approx(-2.008)
    assert value_rescale(torch.tensor(0.0)).item() == 0.0


def test_the_window_cuts_overlapping_sequences_with_the_state_at_their_start():
    w = SequenceWindow(length=4, period=2, num_envs=2, obs_shape=(1,), obs_dtype=torch.float32,
                       action_dtype=torch.long, state_dim=3, device="cpu")
    out = []
    for t in range(8):
        step = {"obs": torch.tensor([[t], [100 + t]], dtype=torch.float32), "action": torch.tensor([t, -t]),
                "reward": torch.full((2,), float(t)), "terminated": torch.zeros(2, dtype=torch.bool),
                "truncated": torch.zeros(2, dtype=torch.bool), "start": torch.tensor([t == 0, t == 5]),
                "state": torch.full((2, 3), float(t))}
        seqs = w.add(**step)
        out.append(seqs)
    emitted = [t for t, s in enumerate(out) if s is not None]
    assert emitted == [3, 5, 7]  # S steps first, then every period
    first, second = out[3], out[5]
    assert first["obs"][0, :, 0].tolist() == [0, 1, 2, 3] and first["obs"][1, :, 0].tolist() == [100, 101, 102, 103]
    assert second["obs"][0, :, 0].tolist() == [2, 3, 4, 5]  # overlapping by S - period = 2
    assert torch.equal(second["state"], torch.full((2, 3), 2.0))  # the state entering the sequence's first step
    assert second["start"][1].tolist() == [False, False, False, True]
    assert second["action"][1].tolist() == [-2, -3, -4, -5]


def test_prioritized_sequence_replay_samples_in_proportion_and_round_trips():
    r = SequenceReplay(4, 3, (2,), torch.float32, torch.long, 5, "cpu", seed=0, prioritized=True, alpha=1.0,
                       beta=1.0, beta_final=1.0, eps=0.0)
    seqs = {"obs": torch.randn(4, 3, 2), "action": torch.zeros(4, 3, dtype=torch.long), "reward": torch.zeros(4, 3),
            "terminated": torch.zeros(4, 3, dtype=torch.bool), "truncated": torch.zeros(4, 3, dtype=torch.bool),
            "start": torch.zeros(4, 3, dtype=torch.bool), "state": torch.arange(20.0).view(4, 5)}
    slots = r.add(seqs)
    r.update_priorities(slots, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    counts = torch.zeros(4)
    for _ in range(500):
        b = r.sample(10)
        counts += torch.bincount(b.indices, minlength=4)
        assert torch.equal(b.state, seqs["state"][b.indices])
    assert torch.allclose(counts / counts.sum(), torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.02)
    torch.testing.assert_close(b.weights, (1.0 / torch.tensor([1.0, 2, 3, 4]))[b.indices])  # (p_min / p)^beta
    again = SequenceReplay(4, 3, (2,), torch.float32, torch.long, 5, "cpu", seed=9, prioritized=True, alpha=1.0,
                           beta=1.0, beta_final=1.0, eps=0.0)
    again.load_state_dict(r.state_dict())
    assert torch.equal(again.sample(6).indices, r.sample(6).indices)


def make_r2d2(**over):
    cfg = build_config("r2d2", "CartPoleNoVel-v1", overrides={
        **QUIET, "r2d2.burn_in": 2, "r2d2.seq_len": 3, "r2d2.n_step": 2, "r2d2.core_size": 8, "r2d2.hidden": [8],
        "r2d2.buffer_size": 600, "r2d2.gamma": 0.5, **over})
    import gymnasium as gym

    import corral.envs  # noqa: F401

    env = gym.make("CartPoleNoVel-v1")
    algo = R2D2(cfg.algo_cfg, env.observation_space, env.action_space, 1, torch.device("cpu"), RNGStreams(0))
    return algo


def hand_batch(algo, rewards, terminated, truncated, starts=None):
    S = algo.sequence
    B = len(rewards)
    g = torch.Generator().manual_seed(1)
    return SequenceBatch(
        obs=torch.randn(B, S, 4, generator=g), action=torch.randint(2, (B, S), generator=g),
        reward=torch.tensor(rewards), terminated=torch.tensor(terminated), truncated=torch.tensor(truncated),
        start=torch.zeros(B, S, dtype=torch.bool) if starts is None else torch.tensor(starts),
        state=torch.randn(B, algo.actor.state_dim, generator=g), weights=torch.ones(B), indices=torch.arange(B))


def test_sequence_targets_follow_the_n_step_double_q_formula_by_hand():
    algo = make_r2d2(**{"r2d2.value_rescaling": False})  # burn-in 2, 3 trained steps, n = 2, gamma 0.5
    # steps:          0    1    2    3    4    5    6   (trained: 2, 3, 4; lookahead to 6)
    rewards = [[0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0], [0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0]]
    term = [[False] * 7, [False, False, False, True, False, False, False]]
    trunc = [[False] * 7, [False, False, False, False, True, False, False]]
    batch = hand_batch(algo, rewards, term, trunc)
    # online picks the next action, target scores it: q at steps 4, 5, 6 (L = 3 rows, B = 2)
    q_online = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    q_target = torch.tensor([[[10.0, 20.0], [30.0, 40.0]], [[50.0, 60.0], [70.0, 80.0]],
                             [[90.0, 100.0], [110.0, 120.0]]])
    target, trained = algo.sequence_targets(batch, q_online, q_target)
    # sequence 0, no episode end: y_t = r_t + 0.5 r_{t+1} + 0.25 Q_target(s_{t+2}, argmax online)
    assert target[0].tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 20, 2 + 0.5 * 4 + 0.25 * 50,
                                                4 + 0.5 * 8 + 0.25 * 100])
    # sequence 1: terminated at step 3, truncated at step 4
    # t=2: 1 + 0.5 * 2, no bootstrap (the episode terminated within the window)
    # t=3: 2 (terminated at once); t=4: truncated at once: left out of the loss
    assert target[1, :2].tolist() == pytest.approx([2.0, 2.0])
    assert trained.tolist() == [[True, True, True], [True, True, False]]
    # with value rescaling: h(r + gamma^n h^-1(Q))
    algo.cfg.value_rescaling = True
    scaled, _ = algo.sequence_targets(batch, q_online, q_target)
    want = value_rescale(torch.tensor(1 + 0.5 * 2 + 0.25 * value_unrescale(torch.tensor(20.0)).item()))
    assert scaled[0, 0].item() == pytest.approx(want.item(), rel=1e-6)


def test_burn_in_steps_get_no_gradient_and_priorities_mix_max_and_mean():
    algo = make_r2d2(**{"r2d2.priority_eta": 0.9})
    batch = hand_batch(algo, [[0.5] * 7] * 3, [[False] * 7] * 3, [[False] * 7] * 3)
    batch.obs.requires_grad_(True)
    phases = algo.phases(batch, {})
    _, loss = next(phases)
    (grad,) = torch.autograd.grad(loss, batch.obs, retain_graph=True)
    assert torch.equal(grad[:, :2], torch.zeros_like(grad[:, :2]))  # burn-in: the state only, no gradient
    assert grad[:, 2:5].abs().sum() > 0  # the trained steps
    # the target net's side and the lookahead give none either (targets are constants)
    assert torch.equal(grad[:, 5:], torch.zeros_like(grad[:, 5:]))
    try:
        phases.send(None)
    except StopIteration as stop:
        _, priority = stop.value
    # recompute |td| and the mix by hand
    with torch.no_grad():
        obs, starts = batch.obs.transpose(0, 1), batch.start.T
        _, s = algo.actor.q_sequence(obs[:2], batch.state, starts[:2])
        q_on, _ = algo.actor.q_sequence(obs[2:], s, starts[2:])
        q_tg, _ = algo.target.q_sequence(obs, batch.state, starts, norm=algo.actor.enc.norm)
        target, _ = algo.sequence_targets(batch, q_on[2:5], q_tg[4:7])
        q = q_on[:3].gather(-1, batch.action[:, 2:5].T.unsqueeze(-1)).squeeze(-1).T
        td = (q - target).abs()
    torch.testing.assert_close(priority, 0.9 * td.amax(1) + 0.1 * td.mean(1))


def test_a_gradient_step_moves_only_the_online_network():
    algo = make_r2d2()
    batch = hand_batch(algo, [[1.0] * 7] * 4, [[False] * 7] * 4, [[False] * 7] * 4)
    before_online = [p.detach().clone() for p in algo.actor.parameters()]
    before_target = [p.detach().clone() for p in algo.target.parameters()]
    algo.train_step(batch)
    assert all(not torch.equal(a, p) for a, p in zip(before_online, algo.actor.parameters()))
    assert all(torch.equal(a, p) for a, p in zip(before_target, algo.target.parameters()))
    assert all(p.grad is None for p in algo.target.parameters())


def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    sets = ["r2d2.burn_in=2", "r2d2.seq_len=4", "r2d2.n_step=2", "r2d2.core_size=16", "r2d2.hidden=[16]",
            "r2d2.batch_size=8", "r2d2.learning_starts=100", "r2d2.buffer_size=2000", "r2d2.train_freq=2",
            "r2d2.target_update_interval=100", "r2d2.exploration_fraction=0", "r2d2.exploration_initial_eps=0.3",
            "r2d2.exploration_final_eps=0.3", "r2d2.normalize_obs=true", "env.num_envs=2", "eval.episodes=0",
            "progress=false", "tensorboard=false"]  # (schedules fixed: those over the run differ by definition)
    n = 400
    a = Learner(build_config("r2d2", "CartPoleNoVel-v1", steps=2 * n, seed=4, sets=sets), None)
    a.train()
    assert main(["train", "r2d2", "CartPoleNoVel-v1", "--steps", str(n), "--seed", "4", "--run-dir",
                 str(tmp_path / "b"), *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for name in ("actor", "target"):
        for pa, pb in zip(getattr(a.algo, name).state_dict().values(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), name
    assert a.algo.grad_steps > 20 and len(a.algo.replay) > 50


def test_cli_trains_drqn_and_r2d2_with_a_gru(tmp_path, capsys):
    for algo, extra in (("drqn", []), ("r2d2", ["--set", "r2d2.recurrent=gru", "--set", "r2d2.burn_in=4"])):
        assert main(["train", algo, "CartPoleNoVel-v1", "--steps", "1600", "--run-dir", str(tmp_path / algo), "--json",
                     "--set", f"{algo}.learning_starts=500", "--set", "eval.episodes=2", "--set", "tensorboard=false",
                     *extra]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["env_steps"] == 1600 and summary["eval"]["episodes"] == 2
        rows = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
        assert any("q_loss" in r for r in rows)
    assert corral.load(tmp_path / "r2d2").algo.actor.core.kind == "gru"


def test_bad_sequence_settings_are_refused_with_the_fix(capsys):
    assert main(["train", "r2d2", "CartPoleNoVel-v1", "--steps", "64", "--set", "r2d2.seq_period=500"]) != 0
    assert "seq_period=500" in capsys.readouterr().err
    assert main(["train", "r2d2", "Pendulum-v1", "--steps", "64"]) != 0
    assert "Discrete" in capsys.readouterr().err


def test_r2d2_solves_cartpole_novel_in_one_process(tmp_path):
    """The preset (corral/presets/r2d2.yaml) for 30k steps: held-out 20-episode evaluations
    500, 500 and 484 on seeds 0, 1, 2 (about 30 s each); the issue asks >= 200 within 300k."""
    agent = corral.train("r2d2", "CartPoleNoVel-v1", steps=30_000, seed=0, run_dir=str(tmp_path / "r"),
                         **{"tensorboard": False, "eval.episodes": 0})
    assert corral.evaluate(agent, episodes=20, seed=123)["mean_return"] >= 300


def test_r2d2_runs_in_process_collectors_through_a_sequence_replay_server():
    """The distributed loop with its collectors in this process: every sequence the server
    cut comes back into the learner's replay after the run, and the learner trained."""
    from corral.schemes.fragments import FragmentScheme

    over = {**QUIET, "scheme.collectors": 2, "env.num_envs": 2, "r2d2.burn_in": 2, "r2d2.seq_len": 4,
            "r2d2.n_step": 2, "r2d2.core_size": 16, "r2d2.hidden": [16], "r2d2.batch_size": 8,
            "r2d2.learning_starts": 256, "r2d2.rollout_fragment": 16, "r2d2.buffer_size": 4000}
    L = Learner(build_config("r2d2", "CartPoleNoVel-v1", steps=2048, overrides=over), None, quiet=True)
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    L.train()
    # each collector's 2 columns saw 512 steps: sequences of 8 every 4 steps after the first 8
    assert len(L.algo.replay) == 2 * 2 * ((512 - 8) // 4 + 1)
    assert L.algo.grad_steps > 50


@pytest.mark.slow
def test_r2d2_with_two_ray_collectors_learns_cartpole_novel_and_survives_a_killed_collector(ray_local, tmp_path):
    """2 Ray collectors x 4 envs on the epsilon ladder, a sequence replay server; one collector
    is killed after its fifth fragment and restarted. Robust by design: the run stops at the
    first periodic deterministic evaluation (10 episodes every 5k steps) of 500, the best
    evaluation's checkpoint is picked, and the assertion is a held-out evaluation (20 other
    episodes) with a margin: >= 250, where memoryless PPO holds out at about 40."""
    cfg = build_config("r2d2", "CartPoleNoVel-v1", steps=80_000, seed=0, overrides={
        "scheme.collectors": 2, "env.num_envs": 4, "eval.every": 5000, "eval.episodes": 10,
        "eval.stop_at_return": 500, "tensorboard": False, "progress": False})
    from corral.train.setup import new_run_dir

    L = Learner(cfg, new_run_dir(cfg, str(tmp_path / "r")), quiet=True)
    scheme, killed = ray_scheme_killing(L, ray_local, "collector")
    summary = L.train()
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    evals = [(m["step"], m["eval_return"]) for m in map(json.loads, lines) if "eval_return" in m]
    best = corral.load(tmp_path / "r")
    held_out = corral.evaluate(best, "CartPoleNoVel-v1", episodes=20, seed=123)["mean_return"]
    print(f"\nr2d2-ray: steps={summary['env_steps']} restarts={scheme.restarts} held_out={held_out:.1f} evals={evals}")
    assert killed and scheme.restarts >= 1
    assert held_out >= 250, (held_out, evals)


@pytest.mark.slow
def test_drqn_reaches_195_on_cartpole_within_100k(tmp_path):
    """The drqn CartPole-v1 preset (100k steps, about 3 minutes here). Final-policy 20-episode
    evaluations were 500.0 / 239.3 / 216.9 on seeds 0 / 1 / 2, noisy, so the test judges the
    best periodic evaluation's checkpoint (10 episodes every 10k steps) on 20 unseen episodes."""
    corral.train("drqn", "CartPole-v1", seed=0, run_dir=str(tmp_path / "r"),
                 **{"tensorboard": False, "eval.every": 10_000, "eval.episodes": 10})
    best = corral.load(tmp_path / "r")
    assert corral.evaluate(best, "CartPole-v1", episodes=20, seed=123)["mean_return"] >= 195


def test_recurrent_algorithms_train_on_atari_pixels(tmp_path):
    """Pong's 4x84x84 uint8 frames through the Nature CNN, the core and (R2D2) sequence replay."""
    pytest.importorskip("ale_py")
    common = ["--set", "env.num_envs=2", "--set", "eval.episodes=1", "--set", "eval.max_episode_steps=100",
              "--set", "tensorboard=false"]
    runs = {"r2d2": ["--steps", "640", "--set", "r2d2.learning_starts=320", "--set", "r2d2.burn_in=4",
                     "--set", "r2d2.seq_len=8", "--set", "r2d2.batch_size=4", "--set", "r2d2.buffer_size=2000"],
            "ppo_lstm": ["--steps", "256", "--set", "ppo_lstm.n_steps=64", "--set", "ppo_lstm.batch_size=64",
                         "--set", "ppo_lstm.seq_len=16"]}
    for algo, args in runs.items():
        assert main(["train", algo, "ALE/Pong-v5", "--run-dir", str(tmp_path / algo), *args, *common]) == 0
        agent = corral.load(tmp_path / algo)
        assert agent.algo.actor.enc.cnn is not None if algo == "r2d2" else agent.algo.actor.cnn is not None
    assert corral.load(tmp_path / "r2d2").algo.replay is None  # an acting copy holds no replay
