"""REDQ, DroQ, TQC and CrossQ: smoke runs through the CLI, known answers (TQC's truncated
target, REDQ's subsets, CrossQ's batch renorm), gradient isolation, exact resume, bad input
and learning on Pendulum-v1 with a held-out deterministic evaluation."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_offpolicy import fill, make, phase_grads

import corral
from corral.actors.normed import BatchRenorm
from corral.algos import get_algo
from corral.cli import main
from corral.errors import UserError
from corral.rng import RNGStreams
from corral.train.learner import Learner
from corral.train.setup import build_config

NEW = ("redq", "droq", "tqc", "crossq")
TINY = {"redq": ["n_critics=4", "subset=2", "gradient_steps=2", "policy_delay=2"],
        "droq": ["gradient_steps=2", "policy_delay=2"],
        "tqc": ["n_quantiles=5", "top_quantiles_to_drop_per_net=1"],
        "crossq": ["critic_hidden=[32]", "bn_warmup=20", "policy_delay=1"]}
SMALL = {"redq": dict(n_critics=4, subset=2), "droq": {}, "tqc": dict(n_quantiles=5, top_quantiles_to_drop_per_net=1),
         "crossq": dict(critic_hidden=(16,), bn_warmup=5)}


def tiny(algo):
    return [f"{algo}.{kv}" for kv in ["learning_starts=64", "batch_size=32", "hidden=[32]", *TINY[algo]]]


@pytest.mark.parametrize("algo", NEW)
def test_each_runs_through_the_cli(tmp_path, capsys, algo):
    args = ["train", algo, "Pendulum-v1", "--steps", "200", "--run-dir", str(tmp_path / "r"), "--json",
            "--set", "tensorboard=false", "--set", "eval.episodes=1"]
    for kv in tiny(algo):
        args += ["--set", kv]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 200 and math.isfinite(summary["eval_return"])
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_loss" in r and "actor_loss" in r for r in rows)


# ---------------------------------------------------------------------------
# TQC


def test_tqc_target_pools_sorts_and_drops_the_top_k_per_net_by_hand():
    algo = make("tqc", n_critics=2, n_quantiles=3, top_quantiles_to_drop_per_net=1, hidden=(8,))
    # two critics, three quantiles, two rows; pooled and sorted, the top k * N = 2 atoms dropped
    z = torch.tensor([[[1.0, 5.0, 3.0], [0.0, -1.0, 2.0]],
                      [[2.0, 6.0, 0.0], [4.0, 9.0, 8.0]]])  # [N, B, M]
    target = algo.truncated_target(z, next_logp=torch.tensor([2.0, -1.0]), reward=torch.tensor([1.0, 0.0]),
                                   discount=torch.tensor([0.5, 0.0]), alpha=torch.tensor(0.1))
    # row 0: pooled 1 5 3 2 6 0 -> 0 1 2 3 (5, 6 dropped); 1 + 0.5 (z - 0.1 * 2)
    # row 1: discount 0 (terminal): the reward alone, once per kept atom
    expect = torch.tensor([[0.9, 1.4, 1.9, 2.4], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(target, expect)


def test_tqc_critic_loss_is_the_mean_quantile_huber_over_critics_quantiles_and_kept_atoms():
    algo = make("tqc", learning_starts=0, batch_size=4, hidden=(8,), n_critics=2, n_quantiles=4,
                top_quantiles_to_drop_per_net=1)
    fill(algo, 10, 3, None)
    batch = algo.replay.sample(4)
    noise = algo.draw_noise(4)
    obs = algo.actor.enc(batch.obs)
    action = algo.actor.box.to_unit(batch.action)
    alpha = algo.log_alpha.detach().exp()
    loss, _, _ = algo.critic_loss(batch, obs, action, alpha, noise)
    with torch.no_grad():  # the same by loops: target atoms from the truncated pool, then rho_tau(u)
        nxt_a, nxt_logp = algo.actor(algo.actor.enc(batch.next_obs), noise=noise["next"])
        z = algo.critics_target(algo.actor.enc(batch.next_obs), nxt_a)  # [N, B, M]
        q = algo.critics(obs, action)
        total, count = 0.0, 0
        for b in range(4):
            atoms = sorted(z[:, b].flatten().tolist())[:2 * 3]
            atoms = [float(batch.reward[b] + batch.discount[b] * (a - alpha * nxt_logp[b])) for a in atoms]
            for n in range(2):
                for i in range(4):
                    tau = (2 * i + 1) / 8
                    for t in atoms:
                        u = t - float(q[n, b, i])
                        huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                        total += abs(tau - (u < 0)) * huber
                        count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


# ---------------------------------------------------------------------------
# REDQ


def test_redq_subset_comes_from_its_own_stream_and_changes_per_step():
    algo = make("redq", learning_starts=0, batch_size=8, hidden=(8,), n_critics=10, subset=2)
    g = torch.Generator().manual_seed(RNGStreams(0).seeds["subset"])
    others = {k: algo.rng[k].get_state().clone() for k in ("replay", "minibatch", "action", "tau", "noisy")}
    subsets = []
    for _ in range(20):
        noise = algo.draw_noise(8)
        s = noise["subset"]
        assert s.shape == (8, 2) and (s == s[0]).all()  # one subset per step, a row per transition
        assert torch.equal(s[0], torch.randperm(10, generator=g)[:2])  # the subset stream's draws, in order
        subsets.append(tuple(s[0].tolist()))
    assert len(set(subsets)) >= 10  # 45 possible pairs: they change from step to step
    for k, state in others.items():  # no other stream moved
        assert torch.equal(algo.rng[k].get_state(), state), k


def test_redq_target_is_the_min_over_the_subset_and_the_actor_sees_the_ensemble_mean():
    algo = make("redq", learning_starts=0, batch_size=8, hidden=(8,), n_critics=5, subset=2)
    with torch.no_grad():  # targets unlike the online critics, so a mix-up would show
        for p in algo.critics_target.parameters():
            p.add_(torch.randn_like(p))
    x, a = torch.randn(8, 3), torch.rand(8, 1) * 2 - 1
    subset = torch.tensor([4, 1])
    with torch.no_grad():
        full = algo.critics_target(x, a)  # [5, 8]
        got = algo.target_q(x, a, {"subset": subset.expand(8, 2)})
        torch.testing.assert_close(got, full[[4, 1]].min(0).values)
        torch.testing.assert_close(algo.actor_q(x, a, {}), algo.critics(x, a).mean(0))


def test_redq_subset_larger_than_the_ensemble_is_a_user_error():
    with pytest.raises(UserError, match="subset=3 is more than n_critics=2"):
        make("redq", n_critics=2, subset=3)


def test_droq_critics_apply_their_masks_and_layer_norm():
    algo = make("droq", learning_starts=0, batch_size=8, hidden=(16, 16))
    assert algo.cfg.n_critics == 2 and algo.cfg.subset == 2 and algo.cfg.dropout == 0.01 and algo.cfg.layer_norm
    noise = algo.draw_noise(8)
    m = noise["drop_cur0"]
    assert m.shape == (8, 2, 16) and set(m.unique().tolist()) <= {0.0, torch.tensor(1 / 0.99).item()}
    x, a = torch.randn(8, 3), torch.rand(8, 1) * 2 - 1
    c = algo.critics
    with torch.no_grad():  # one critic by hand: Linear, dropout mask, layer norm, relu, ..., Linear
        h = torch.cat([x, a], -1)
        for i in range(2):
            h = h @ c.weights[i][1].T + c.biases[i][1]
            h = h * noise[f"drop_cur{i}"][:, 1]
            h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, correction=0, keepdim=True) + 1e-5)
            h = torch.relu(h * c.ln_weights[i][1] + c.ln_biases[i][1])
        q1 = (h @ c.weights[2][1].T + c.biases[2][1]).squeeze(-1)
        torch.testing.assert_close(algo.current_q(x, a, noise)[1], q1)


# ---------------------------------------------------------------------------
# CrossQ: batch renorm against its formula, no target network, the modes of each pass


def renorm_by_hand(x, mean_r, var_r, steps, warmup, eps=1e-3, r_max=3.0, d_max=5.0):
    mu, var = x.mean(0), x.var(0, correction=0)
    sigma = torch.sqrt(var + eps)
    sigma_r = torch.sqrt(var_r + eps)
    r = (sigma / sigma_r).clamp(1 / r_max, r_max) if steps >= warmup else torch.ones_like(mu)
    d = ((mu - mean_r) / sigma_r).clamp(-d_max, d_max) if steps >= warmup else torch.zeros_like(mu)
    return (x - mu) / sigma * r + d


def test_batch_renorm_matches_its_formula_in_train_and_eval_mode_with_running_stats_and_clipping():
    torch.manual_seed(0)
    bn = BatchRenorm(3, momentum=0.1, warmup=2)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    affine = lambda z: z * bn.weight.detach() + bn.bias.detach()  # noqa: E731
    mean_r, var_r = torch.zeros(3), torch.ones(3)
    # feature 0 near the running stats; 1 with a large mean (d clipped at 5); 2 with a tiny spread (r clipped at 1/3)
    for step in range(4):
        x = torch.randn(64, 3) * torch.tensor([1.0, 1.0, 0.01]) + torch.tensor([0.2, 50.0, 0.0])
        y = bn(x, train=True)
        torch.testing.assert_close(y, affine(renorm_by_hand(x, mean_r, var_r, step, 2)), rtol=1e-5, atol=1e-5)
        mean_r = mean_r + 0.1 * (x.mean(0) - mean_r)
        var_r = var_r + 0.1 * (x.var(0) - var_r)  # the unbiased batch variance
        torch.testing.assert_close(bn.running_mean, mean_r)
        torch.testing.assert_close(bn.running_var, var_r)
        assert int(bn.steps) == step + 1
    # after warm-up the clips bind: d of feature 1 at d_max, r of feature 2 at 1/r_max
    sigma_r = torch.sqrt(var_r + 1e-3)
    assert ((x.mean(0)[1] - mean_r[1]) / sigma_r[1]).abs() > 5
    assert torch.sqrt(x.var(0, correction=0)[2] + 1e-3) / sigma_r[2] < 1 / 3
    # eval mode: the running statistics, nothing moves
    x = torch.randn(5, 3)
    y = bn(x)
    torch.testing.assert_close(y, affine((x - mean_r) / torch.sqrt(var_r + 1e-3)))
    torch.testing.assert_close(bn.running_mean, mean_r)
    assert int(bn.steps) == 4


def test_batch_renorm_clips_r_and_d_where_the_batch_is_far_from_the_running_stats():
    bn = BatchRenorm(2, momentum=0.0, warmup=0)  # momentum 0: running stats stay at 0 / 1
    x = torch.tensor([[100.0, 0.0], [102.0, 0.001], [98.0, -0.001], [100.0, 0.0]])
    y = bn(x, train=True).detach()
    mu, sigma = x.mean(0), torch.sqrt(x.var(0, correction=0) + 1e-3)
    sigma_r = math.sqrt(1 + 1e-3)
    # feature 0: r = sigma / sigma_r = 1.41 (inside), d = 100 / sigma_r clipped to 5
    torch.testing.assert_close(y[:, 0], (x[:, 0] - mu[0]) / sigma[0] * (sigma[0] / sigma_r) + 5.0)
    # feature 1: r = 0.03 clipped to 1/3, d = 0
    torch.testing.assert_close(y[:, 1], (x[:, 1] - mu[1]) / sigma[1] / 3.0)


def test_batch_renorm_batched_members_keep_their_own_statistics():
    bn = BatchRenorm(2, members=3, momentum=1.0, warmup=0)
    x = torch.randn(3, 16, 2) + torch.arange(3.0).view(3, 1, 1) * 10
    bn(x, train=True)
    torch.testing.assert_close(bn.running_mean, x.mean(1, keepdim=True))


def test_crossq_has_no_target_network_and_no_polyak_step():
    algo = make("crossq", learning_starts=0, batch_size=16, hidden=(16,), **SMALL["crossq"])
    assert "critics_target" not in algo.networks and not hasattr(algo, "critics_target")
    assert "critics_target" not in algo.state_dict()
    assert algo.actor_opt.betas == (0.5, 0.999) and algo.critic_opt.betas == (0.5, 0.999)


def test_crossq_modes_joint_train_forward_for_critics_train_actor_for_its_loss_eval_for_acting():
    algo = make("crossq", learning_starts=0, batch_size=16, hidden=(16,), **SMALL["crossq"], policy_delay=1)
    fill(algo, 40, 3, None)
    critic_norms = list(algo.critics.net.norms)
    actor_norms = list(algo.actor.net.norms)
    steps = lambda norms: [int(n.steps) for n in norms]  # noqa: E731
    # acting moves no statistics
    algo.explore(torch.randn(1, 3))
    algo.act(torch.randn(1, 3))
    assert steps(critic_norms) == [0, 0] and steps(actor_norms) == [0, 0]
    batch = algo.replay.sample(16)
    seen = []
    real = BatchRenorm.forward

    def spy(self, x, train=False):
        seen.append(("critic" if any(self is n for n in critic_norms) else "actor", train, x.shape[-2]))
        return real(self, x, train)

    BatchRenorm.forward = spy
    try:
        noise = algo.draw_noise(16)
        phase_grads(algo, batch, noise)
    finally:
        BatchRenorm.forward = real
    first = [s for s in seen if s[0] == "critic"][:2]
    # next action: actor in eval mode; then ONE critic forward in train mode over 2B rows (s, a and s', a')
    assert seen[0] == ("actor", False, 16) and first == [("critic", True, 32)] * 2
    assert ("actor", True, 16) in seen  # the actor loss trains the actor's statistics
    assert ("critic", False, 16) in seen  # ... against critics in eval mode
    assert steps(critic_norms) == [1, 1] and steps(actor_norms) == [1, 1]


def test_crossq_refuses_gradient_workers_and_pixels():
    from corral.schemes.grad import sharded_class

    algo = make("crossq", hidden=(16,), buffer_size=64, **SMALL["crossq"])
    with pytest.raises(UserError, match="grad_workers=1"):
        sharded_class(algo)
    pixels = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    spec = get_algo("crossq")
    with pytest.raises(UserError, match="vector observations"):
        spec.cls(spec.cls.Config(), pixels, gym.spaces.Box(-1, 1, (1,), np.float32), 1, torch.device("cpu"),
                 RNGStreams(0))


def test_tqc_dropping_every_quantile_is_a_user_error():
    with pytest.raises(UserError, match="top_quantiles_to_drop_per_net=5"):
        make("tqc", n_quantiles=5, top_quantiles_to_drop_per_net=5)


# ---------------------------------------------------------------------------
# every algorithm: gradient isolation, exact resume


@pytest.mark.parametrize("algo_name", NEW)
def test_each_loss_reaches_and_moves_only_its_own_network(algo_name):
    algo = make(algo_name, learning_starts=0, batch_size=16, hidden=(16,), lr=1e-2, policy_delay=1,
                **SMALL[algo_name])
    fill(algo, 40, 3, None)
    phases = phase_grads(algo, algo.replay.sample(16))
    assert phases == [("critic_opt", {"critics"}, {"critics"}), ("actor_opt", {"actor"}, {"actor"}),
                      ("alpha_opt", {"log_alpha"}, {"log_alpha"})]
    assert all(p.requires_grad for p in algo.critics.parameters())


@pytest.mark.parametrize("algo", NEW)
def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path, algo):
    n = 150
    sets = [f"{algo}.{kv}" for kv in ["learning_starts=100", "batch_size=32", "hidden=[16]", *TINY[algo]]]
    sets += ["eval.episodes=0", "progress=false", "tensorboard=false", f"{algo}.normalize_obs=true"]
    a = Learner(build_config(algo, "Pendulum-v1", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", algo, "Pendulum-v1", "--steps", str(n), "--seed", "3", "--run-dir", str(tmp_path / "b"),
                 *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    assert a.algo.grad_steps > 0
    for name in a.algo.networks:
        sa, sb = getattr(a.algo, name).state_dict(), getattr(b.algo, name).state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), (name, k)
    assert torch.equal(a.algo.log_alpha, b.algo.log_alpha)


def test_tqc_fused_quantile_huber_gives_quantile_huber_loss_values_and_gradients():
    from corral.algos.distributional import quantile_huber_loss
    from corral.algos.tqc import _QuantileHuber

    g = torch.Generator().manual_seed(0)
    pred = torch.randn(37, 12, generator=g) * 3  # 37 rows: chunks of 16 and a remainder
    target, taus = torch.randn(37, 9, generator=g) * 3, torch.rand(12, generator=g)
    weights = torch.rand(37, generator=g)
    for kappa in (1.0, 0.5):
        p1, p2 = pred.clone().requires_grad_(), pred.clone().requires_grad_()
        l1, l2 = quantile_huber_loss(p1, target, taus, kappa), _QuantileHuber.apply(p2, target, taus, kappa)
        torch.testing.assert_close(l2, l1)
        (l1 * weights).sum().backward()
        (l2 * weights).sum().backward()
        torch.testing.assert_close(p2.grad, p1.grad)


# ---------------------------------------------------------------------------
# learning: >= -200 on Pendulum-v1 within 15k steps, held out (10 episodes, seed 123, the
# policy's mode) from the best periodic evaluation (10 episodes every 1000 steps; the run
# stops once one reaches -160). Networks 64x64 (CrossQ's critics 128x128) and G = 5 for
# REDQ / DroQ; the other hyperparameters are the presets'. Seed 0 of droq, tqc and crossq runs in CI,
# the rest is slow. Measured on every seed (docs/ledger.md): held-out -130 to -162, except
# CrossQ's seed 2 at -191.8.
LEARN = {
    "redq": {"redq.hidden": [64, 64], "redq.gradient_steps": 5, "redq.policy_delay": 5},
    "droq": {"droq.hidden": [64, 64], "droq.gradient_steps": 5, "droq.policy_delay": 5},
    "tqc": {"tqc.hidden": [64, 64]},
    "crossq": {"crossq.hidden": [64, 64], "crossq.critic_hidden": [128, 128]},
}


def heldout_after_learning(algo, seed, tmp_path, sets=None):
    agent = corral.train(algo, "Pendulum-v1", steps=15_000, seed=seed, run_dir=str(tmp_path / "run"),
                         **{"eval.every": 1000, "eval.episodes": 10, "eval.stop_at_return": -160,
                            "tensorboard": False, "progress": False, **(sets or LEARN[algo])})
    assert agent.summary["env_steps"] <= 15_000
    best = corral.load(tmp_path / "run")  # the best periodic evaluation's checkpoint
    return corral.evaluate(best, "Pendulum-v1", episodes=10, seed=123)["mean_return"]


# REDQ's seed-0 run took 550 s at load ~12 (86 s at load ~4): slow. DroQ's stops at its first
# evaluation (1000 env steps, 5000 critic steps): 31.4 s of process CPU at load ~40 (2026-12-02,
# after the fused actor), 31 s wall at load ~4 before it, so it runs in CI.
CI_LEARN = [pytest.param("redq", marks=pytest.mark.slow), "droq", "tqc", "crossq"]


@pytest.mark.parametrize("algo", CI_LEARN)
def test_each_reaches_minus_200_on_pendulum_within_15k_steps(tmp_path, algo):
    assert heldout_after_learning(algo, 0, tmp_path) >= -200


def test_redq_with_a_small_ensemble_reaches_minus_200_on_pendulum_in_ci(tmp_path):
    # REDQ's CI run: N = 5 critics (subset M = 2, drawn per step), batch 128, G = 5. Seed 0
    # stopped at 2000 env steps (10k critic steps), held out -138.5, 40.1 s of process CPU at
    # load ~30 (2026-12-02); the N = 10, batch 256 run above is slow.
    sets = {**LEARN["redq"], "redq.n_critics": 5, "redq.batch_size": 128}
    assert heldout_after_learning("redq", 0, tmp_path, sets) >= -200


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("algo", NEW)
def test_each_reaches_minus_200_on_pendulum_within_15k_steps_on_more_seeds(tmp_path, algo, seed):
    assert heldout_after_learning(algo, seed, tmp_path) >= -200


@pytest.mark.slow
def test_tqc_solves_bipedalwalker_within_300k_steps(tmp_path):
    # Issue 13: a deterministic eval >= 300 over 20 unseen episodes within 300k env steps, the
    # preset (rl-zoo's tqc.yml values, 256x256 networks) stopped at its first periodic eval of
    # 310. Seed 0 stopped at 80k steps, held out 316.9 +- 1.2 (1,933 s on one CPU core,
    # 2026-12-04; docs/ledger.md has the curve and seed 1).
    pytest.importorskip("Box2D")
    corral.train("tqc", "BipedalWalker-v3", seed=0, run_dir=str(tmp_path / "run"),
                 **{"eval.every": 20_000, "eval.episodes": 10, "eval.num_envs": 10, "eval.stop_at_return": 310,
                    "tensorboard": False})
    agent = corral.load(tmp_path / "run")  # its best.pt
    assert agent.cfg.steps <= 300_000
    assert corral.evaluate(agent, "BipedalWalker-v3", episodes=20, seed=123)["mean_return"] >= 300
