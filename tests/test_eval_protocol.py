"""The evaluation protocol (corral.train.evaluate): episodes that end, a time budget, epsilon
from its own stream, statistics against hand-worked values, and the protocol in every result."""

import json
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from corral.cli import main
from corral.envs import make_vec_env
from corral.envs.atari import register_ale
from corral.errors import UserError
from corral.rng import STREAMS, RNGStreams
from corral.train.evaluate import (
    bootstrap_ci,
    epsilon_greedy,
    eval_generator,
    evaluate_policy,
    iqm,
    resolve_protocol,
    summarize,
    summarize_seeds,
)
from corral.train.learner import Learner
from corral.train.setup import build_config, make_env

QUIET = {"tensorboard": False, "progress": False}
atari = pytest.mark.skipif(not register_ale(), reason="needs ale-py: pip install 'corral[atari]'")


def noop(obs):
    return torch.zeros(obs.shape[0], dtype=torch.long)


# --- episodes that end


@atari
def test_a_policy_that_never_presses_fire_ends_every_episode_at_the_cap():
    # Breakout waits for FIRE: without corral's FIRE the no-op policy would play until the cap
    env = make_vec_env("Breakout", 2, atari_wrappers={"episodic_life": False, "clip_rewards": False,
                                                      "fire_reset": False}, max_episode_steps=40)
    cfg = build_config("dqn", "Breakout", sets=["eval.max_episode_steps=40"])
    protocol = resolve_protocol(cfg, SimpleNamespace(value_method=False))
    try:
        result = evaluate_policy(noop, env, 4, protocol, seed=0)
    finally:
        env.close()
    assert result["episodes"] == 4 and result["episodes_at_cap"] == 4
    assert result["mean_return"] == 0.0
    # 40 agent steps = 160 frames, of which up to 30 were the reset's random no-ops
    assert 32 <= result["mean_length"] <= 40
    assert result["protocol"]["max_episode_steps"] == 40 and result["protocol"]["max_episode_frames"] == 160
    assert result["protocol"]["episode_cap"] == "eval.max_episode_steps"


@atari
def test_with_fire_after_a_lost_life_the_same_policy_plays_whole_games_to_game_over():
    cfg = build_config("dqn", "Breakout", sets=["eval.max_episode_steps=3000"])
    env = make_env(cfg, num_envs=2, evaluation=True)
    try:
        result = evaluate_policy(noop, env, 2, resolve_protocol(cfg), seed=0)
    finally:
        env.close()
    assert result["episodes"] == 2 and result["episodes_at_cap"] == 0  # five lives lost, each followed by FIRE
    assert result["mean_length"] < 3000


def test_max_seconds_stops_an_evaluation_and_reports_the_episodes_it_finished():
    env = make_vec_env("CartPole-v1", 2)
    cfg = build_config("ppo", "CartPole-v1", sets=["eval.max_seconds=0.3"])

    def slow(obs):
        time.sleep(0.002)
        return noop(obs)

    seen = []
    try:
        result = evaluate_policy(slow, env, 10_000, resolve_protocol(cfg), seed=0,
                                 on_episode=lambda *a: seen.append(a))
    finally:
        env.close()
    assert result["stopped"] == "max_seconds" and result["episodes_requested"] == 10_000
    assert 0 < result["episodes"] < 10_000 and result["seconds"] < 2
    assert len(seen) == result["episodes"]  # the progress callback heard each one
    finished, total, mean, _ = seen[-1]
    assert (finished, total) == (result["episodes"], 10_000) and mean == pytest.approx(result["mean_return"])


def test_a_run_reports_a_time_limited_final_evaluation_in_its_summary_and_eval_json(tmp_path):
    cfg = build_config("ppo", "CartPole-v1", steps=128, overrides={
        **QUIET, "ppo.n_steps": 64, "ppo.batch_size": 64, "ppo.n_epochs": 1, "eval.episodes": 100_000,
        "eval.num_envs": 2, "eval.max_seconds": 0.5})
    learner = Learner(cfg, tmp_path, quiet=True)
    (tmp_path / "checkpoints").mkdir()
    t0 = time.perf_counter()
    summary = learner.train()
    assert time.perf_counter() - t0 < 20
    ev = summary["eval"]
    assert ev["stopped"] == "max_seconds" and 0 < ev["episodes"] < 100_000
    assert ev["protocol"]["max_seconds"] == 0.5
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written["episodes"] == ev["episodes"] and written["stopped"] == "max_seconds"


# --- epsilon from its own stream


def test_epsilon_greedy_draws_from_its_generator_and_nothing_else():
    import gymnasium as gym

    space = gym.spaces.Discrete(4)
    obs = torch.zeros(1000, 2)
    g = eval_generator(123)
    acts = epsilon_greedy(noop, space, 0.3, g)(obs)
    # the same draws by hand: N random actions, then N uniforms
    ref = torch.Generator().manual_seed(123)
    random_action = torch.randint(4, (1000,), generator=ref)
    explore = torch.rand(1000, generator=ref) < 0.3
    assert torch.equal(acts, torch.where(explore, random_action, torch.zeros_like(random_action)))
    assert 0.25 < explore.float().mean() < 0.35
    assert torch.equal(epsilon_greedy(noop, space, 0.3, eval_generator(123))(obs), acts)  # reproducible
    assert epsilon_greedy(noop, space, 0.0, None) is noop  # epsilon 0: the policy itself, no draws
    with pytest.raises(UserError, match="Discrete"):
        epsilon_greedy(noop, gym.spaces.Box(-1, 1, (2,)), 0.1, g)


def test_eval_epsilon_is_reproducible_and_leaves_the_training_streams_alone():
    cfg = build_config("dqn", "CartPole-v1", steps=64, overrides={
        **QUIET, "learning_starts": 1000, "eval.episodes": 4, "eval.num_envs": 2, "eval.epsilon": 0.5})
    learner = Learner(cfg, None, quiet=True)
    from corral.train.hooks import EvalHook, MetricsHook

    hook = EvalHook(learner, MetricsHook(learner))
    before = {k: g.get_state().clone() for k, g in learner.rng.generators.items()}
    global_before = torch.get_rng_state().clone()
    first = hook.evaluate(learner)
    second = hook.evaluate(learner)
    for k, g in learner.rng.generators.items():
        assert torch.equal(g.get_state(), before[k]), f"evaluation moved the {k!r} stream"
    assert torch.equal(torch.get_rng_state(), global_before)
    assert first["protocol"]["epsilon"] == 0.5 and first["episodes"] == 4
    assert [first[k] for k in ("mean_return", "min_return", "max_return")] == \
           [second[k] for k in ("mean_return", "min_return", "max_return")]
    learner.cfg.eval.epsilon = 0.0
    hook.protocol = resolve_protocol(learner.cfg, learner.algo)
    assert hook.evaluate(learner)["protocol"]["epsilon"] == 0.0
    hook.env.close()
    learner.env.close()


def test_the_eval_action_stream_comes_after_the_others_and_keeps_their_seeds():
    assert STREAMS[-6:] == ("noise", "tau", "noisy", "eval_action", "subset", "rnd")  # REDQ's subset, then RND's mask, came later
    seeds = RNGStreams(7).seeds
    root = np.random.SeedSequence([7, 0]).spawn(7)  # the seven streams there were before
    assert [seeds[n] for n in STREAMS[:7]] == [int(c.generate_state(1, dtype=np.uint32)[0]) for c in root]
    assert "eval_action" not in RNGStreams(7).generators  # a fresh generator per evaluation, never saved


@atari
def test_default_protocol_per_family():
    dqn, ppo = SimpleNamespace(value_method=True), SimpleNamespace(value_method=False)
    atari = build_config("dqn", "Breakout")
    p = resolve_protocol(atari, dqn)
    assert (p.family, p.epsilon, p.deterministic) == ("atari", 0.05, True)
    assert (p.max_episode_steps, p.max_episode_frames, p.episode_cap) == (27_000, 108_000, "ALE")
    assert (p.repeat_action_probability, p.frame_skip, p.fire_reset) == (0.25, 4, True)
    assert resolve_protocol(build_config("ppo", "Breakout"), ppo).epsilon == 0.0  # the policy's mode
    cart = resolve_protocol(build_config("dqn", "CartPole-v1"), dqn)
    assert (cart.family, cart.epsilon, cart.max_episode_steps, cart.episode_cap) == ("gymnasium", 0.0, 500, "env")
    native = resolve_protocol(build_config("ppo", "native:CartPole-v1"), ppo)
    assert (native.family, native.max_episode_steps) == ("native", 500)
    # the real DQN class counts as a value method without saying so
    from corral.train.evaluate import is_value_method

    learner = Learner(build_config("dqn", "CartPole-v1", overrides=QUIET), None, quiet=True)
    assert is_value_method(learner.algo)
    learner.env.close()


@atari
def test_sticky_actions_are_an_atari_option_that_reaches_the_game_and_the_protocol():
    cfg = build_config("dqn", "Breakout", sets=["env.repeat_action_probability=0.0"])
    assert resolve_protocol(cfg).repeat_action_probability == 0.0
    env = make_env(cfg, num_envs=1, evaluation=True)
    try:
        assert env.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    finally:
        env.close()
    with pytest.raises(UserError, match="Atari option"):
        make_env(build_config("ppo", "CartPole-v1", sets=["env.repeat_action_probability=0.25"]))
    with pytest.raises(UserError, match="out of range"):
        build_config("dqn", "Breakout", sets=["eval.epsilon=1.5"])


# --- statistics against hand-worked values


def test_summary_statistics_of_a_fixed_sample():
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (s["mean_return"], s["median_return"], s["min_return"], s["max_return"]) == (4.0, 3.0, 1.0, 10.0)
    assert s["std_return"] == pytest.approx(math.sqrt((9 + 4 + 1 + 0 + 36) / 5))  # of the episodes, ddof 0
    assert s["episodes"] == 5
    empty = summarize([])
    assert empty["episodes"] == 0 and math.isnan(empty["mean_return"])


def test_bootstrap_interval_against_hand_worked_resampling_distributions():
    # [0, 0, 0, 1]: a resample's mean is k/4 with k ~ Binomial(4, 1/4): P(k=0) = 81/256 = 0.316
    # holds the 2.5% quantile, P(k<=2) = 243/256 = 0.949 < 0.975 < P(k<=3) = 255/256 = 0.996
    assert bootstrap_ci([0, 0, 0, 1]) == (0.0, 0.75)
    # [0, 1]: the means 0, 1/2, 1 with chances 1/4, 1/2, 1/4
    assert bootstrap_ci([0, 1]) == (0.0, 1.0)
    assert bootstrap_ci([3, 3, 3]) == (3.0, 3.0)
    sample = [12.0, 7.0, 3.0, 15.0, 9.0, 11.0, 4.0, 8.0]
    lo, hi = bootstrap_ci(sample)
    assert bootstrap_ci(sample) == (lo, hi)  # fixed seed
    assert lo < np.mean(sample) < hi
    # against the normal approximation mean +- 1.96 * std / sqrt(n) (8.625 +- 2.64)
    assert lo == pytest.approx(8.625 - 1.96 * np.std(sample) / math.sqrt(8), abs=0.5)
    assert hi == pytest.approx(8.625 + 1.96 * np.std(sample) / math.sqrt(8), abs=0.5)
    assert summarize(sample)["ci95_return"] == [lo, hi]


def test_interquartile_mean_drops_a_quarter_at_each_end():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # mean of 3, 4, 5, 6
    assert iqm([10, 1, 3, 2, 100]) == 5.0  # floor(5/4) = 1 each end: mean of 2, 3, 10
    assert iqm([1, 2, 3, 4]) == 2.5
    assert iqm([1, 2, 9]) == 4.0  # fewer than 4: nothing to drop
    s = summarize_seeds({0: 10.0, 1: 1.0, 2: 3.0, 3: 2.0, 4: 100.0})
    assert s["iqm"] == 5.0 and s["median"] == 3.0 and s["seeds"] == 5 and s["per_seed"][4] == 100.0


# --- what the CLI states


@atari
def test_corral_eval_prints_and_writes_the_protocol_next_to_the_score(tmp_path, capsys):
    rd = str(tmp_path / "r")
    assert main(["train", "dqn", "Breakout", "--steps", "64", "--run-dir", rd, "--json", "--set", "eval.episodes=1",
                 "--set", "eval.num_envs=1", "--set", "eval.max_episode_steps=60", "--set", "tensorboard=false",
                 "--set", "learning_starts=1000", "--set", "buffer_size=1000"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    proto = summary["eval"]["protocol"]
    assert (proto["epsilon"], proto["max_episode_steps"], proto["repeat_action_probability"]) == (0.05, 60, 0.25)
    assert json.loads((tmp_path / "r" / "eval.json").read_text())["protocol"] == proto
    assert main(["eval", rd, "--episodes", "2", "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"mean_return", "std_return", "median_return", "min_return", "max_return", "ci95_return",
            "episodes"} <= set(result)
    assert result["protocol"]["epsilon"] == 0.05 and result["protocol"]["max_episode_steps"] == 60
    assert main(["eval", rd, "--episodes", "2", "--epsilon", "0", "--max-seconds", "30"]) == 0
    out, err = capsys.readouterr()
    assert "protocol: atari; mode actions, epsilon 0" in out and "sticky actions 0.25" in out
    assert "episodes capped at 60 steps (240 frames)" in out
    assert "episode 2/2" in err  # a line per finished episode while it evaluates


def test_the_progress_bar_shows_evaluation_episodes_as_they_finish(capsys, monkeypatch):
    from corral.train.hooks import ProgressHook

    shown = []
    real = ProgressHook.eval_episode

    def spy(self, finished, total, mean, seconds):
        shown.append((finished, total))
        real(self, finished, total, mean, seconds)

    monkeypatch.setattr(ProgressHook, "eval_episode", spy)
    cfg = build_config("ppo", "CartPole-v1", steps=128, overrides={
        "tensorboard": False, "progress": True, "ppo.n_steps": 64, "ppo.batch_size": 64, "ppo.n_epochs": 1,
        "eval.episodes": 3, "eval.num_envs": 3})
    Learner(cfg, None).train()
    assert shown == [(1, 3), (2, 3), (3, 3)]
    assert "last eval 3/3 episodes, mean" in capsys.readouterr().err


def test_native_evaluation_takes_epsilon_from_the_eval_action_stream():
    from corral.train.evaluate import evaluate_native

    cfg = build_config("ppo", "native:CartPole-v1", steps=1, device="cpu", overrides=QUIET)
    learner = Learner(cfg, None, quiet=True)
    greedy = evaluate_native(learner.algo.actor, "CartPole-v1", episodes=8, seed=1)
    noisy = evaluate_native(learner.algo.actor, "CartPole-v1", episodes=8, seed=1, epsilon=0.5)
    again = evaluate_native(learner.algo.actor, "CartPole-v1", episodes=8, seed=1, epsilon=0.5)
    assert torch.equal(noisy, again) and not torch.equal(noisy, greedy)
