"""MIMO downlink beamforming (corral.problems.mimo): known answers for the sum rate, ZF, WMMSE's
update and monotonicity, the power repair, corral's optimizer, the one-pass policy and the CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from corral.errors import UserError
from corral.problems import mimo
from corral.problems.base import InfeasibleSolution
from corral.problems.mimo_policy import BeamPolicy, train_policy
from corral.solve import add_solve_parser


def c(x):
    return torch.as_tensor(x, dtype=torch.complex128)


def test_sum_rate_on_a_hand_worked_two_user_channel():
    # user 0 hears beam 1 through 0.5j: SINR 1 / (0.25 + 1); user 1 is interference-free: SINR 1
    H = c([[1, 0.5j], [0, 1]])
    W = c([[1, 0], [0, 1]])
    assert float(mimo.sum_rate(H, W)) == pytest.approx(math.log2(1 + 1 / 1.25) + 1.0, abs=1e-12)
    # noise 4 instead of 1
    assert float(mimo.sum_rate(H, W, noise=4.0)) == pytest.approx(math.log2(1 + 1 / 4.25) + math.log2(1.25))


def test_rayleigh_channels_are_fixed_by_their_seed_and_unit_variance():
    H = mimo.rayleigh(4, 4, 0, count=3)
    assert torch.equal(H[2], mimo.rayleigh(4, 4, 2)[0])
    big = mimo.rayleigh(64, 64, 7)[0]
    assert float(big.abs().square().mean()) == pytest.approx(1.0, abs=0.06)
    p = mimo.load_mimo("rayleigh:N=4,K=4,snr=20,seed=2")
    assert torch.equal(p.H, H[2]) and p.P == pytest.approx(100.0)


def test_zero_forcing_leaves_no_interference_and_spends_the_budget():
    H = mimo.rayleigh(6, 4, 3)[0]
    W = mimo.zero_forcing(H, 10.0)
    G = H @ W
    off = G - torch.diag(torch.diagonal(G))
    assert float(off.abs().max()) < 1e-10
    assert float(mimo.power(W)) == pytest.approx(10.0)


def test_water_filling_matches_a_hand_worked_case():
    # floors 1/g = 0.5, 1, 4; with P = 2 the level is 1.75: powers 1.25, 0.75, 0
    p = mimo.water_fill(torch.tensor([2.0, 1.0, 0.25], dtype=torch.float64), 2.0)
    assert p.tolist() == pytest.approx([1.25, 0.75, 0.0])


def test_wmmse_one_step_matches_the_hand_computed_update_on_a_scalar_channel():
    # h = 1, v = 1, noise 1: u = 1/2, e = 1/2, w = 2, A = |u|^2 w |h|^2 = 1/2, b = h u w = 1
    H, W = c([[[1.0]]]), c([[[1.0]]])
    u, e, w = mimo.wmmse_receivers(H, W)
    assert (complex(u), float(e), float(w)) == pytest.approx((0.5, 0.5, 2.0))
    # P = 2: v(0) = 2 is over the budget, so mu solves 1 / (1/2 + mu) = sqrt(2)
    V, mu = mimo.wmmse_transmit(H, u, w, 2.0)
    assert float(mu) == pytest.approx(1 / math.sqrt(2) - 0.5, abs=1e-9)
    assert complex(V) == pytest.approx(math.sqrt(2), abs=1e-9)
    # P = 8: v(0) = 2 fits, mu = 0
    V, mu = mimo.wmmse_transmit(H, u, w, 8.0)
    assert float(mu) == 0.0 and complex(V) == pytest.approx(2.0)


def test_wmmse_one_step_on_a_two_user_diagonal_channel():
    # H = diag(1, 2), W = I, P = 2: user 1 u = 1/2, w = 2; user 2 u = 2/5, w = 5;
    # A = diag(1/2, 16/5), b = (1, 4): v_k = b_k / (A_kk + mu) with 1/(1/2+mu)^2 + 16/(16/5+mu)^2 = 2
    H, W = c([[1, 0], [0, 2]]), c([[1, 0], [0, 1]])
    u, _, w = mimo.wmmse_receivers(H, W)
    assert u.real.tolist() == pytest.approx([0.5, 0.4]) and w.tolist() == pytest.approx([2.0, 5.0])
    V, mu = mimo.wmmse_transmit(H, u, w, 2.0)
    m = float(mu)
    assert 1 / (0.5 + m) ** 2 + 16 / (3.2 + m) ** 2 == pytest.approx(2.0, rel=1e-8)
    assert V.real.diagonal().tolist() == pytest.approx([1 / (0.5 + m), 4 / (3.2 + m)], rel=1e-9)
    assert float(V.imag.abs().max()) < 1e-12 and float(V[0, 1].abs() + V[1, 0].abs()) < 1e-12


def test_wmmse_never_increases_the_weighted_mse_objective():
    H = mimo.rayleigh(4, 4, 11, count=4)
    P = mimo.power_of(20)
    W = mimo.random_beams((4, 4, 4), P, torch.Generator().manual_seed(0))
    u, _, w = mimo.wmmse_receivers(H, W)
    f = mimo.wmmse_objective(H, W, u, w)
    rate = mimo.sum_rate(H, W)
    for _ in range(30):
        W, _ = mimo.wmmse_transmit(H, u, w, P)  # the beam block
        f_v = mimo.wmmse_objective(H, W, u, w)
        u, _, w = mimo.wmmse_receivers(H, W)  # the receiver and weight blocks
        f_uw = mimo.wmmse_objective(H, W, u, w)
        assert bool((f_v <= f + 1e-9).all()) and bool((f_uw <= f_v + 1e-9).all())
        # with optimal u and w the objective is K - ln(2) * sum rate: the rate never falls
        assert f_uw.tolist() == pytest.approx((4 - math.log(2) * mimo.sum_rate(H, W)).tolist(), abs=1e-9)
        new = mimo.sum_rate(H, W)
        assert bool((new >= rate - 1e-9).all()) and bool(mimo.feasible(W, P).all())
        f, rate = f_uw, new


def test_power_repair_never_returns_an_infeasible_beam_set():
    gen = torch.Generator().manual_seed(3)
    W = torch.randn(64, 5, 3, generator=gen, dtype=torch.complex128)
    W = W * torch.logspace(-12, 12, 64, dtype=torch.float64)[:, None, None]
    W[0] = 0
    W[1, 0, 0] = complex("nan")
    for P in (1e-3, 1.0, 10.0, 100.0, 1e6):
        R = mimo.repair(W, P)
        assert bool(mimo.feasible(R, P).all()) and bool(torch.isfinite(torch.view_as_real(R)).all())
        assert mimo.power(R).tolist() == pytest.approx([P] * 64, rel=1e-9)


def test_repair_never_lowers_the_sum_rate_of_an_under_powered_set():
    H = mimo.rayleigh(4, 4, 5, count=8)
    W = mimo.random_beams((8, 4, 4), 10.0, torch.Generator().manual_seed(1)) * 0.3
    assert bool((mimo.sum_rate(H, mimo.repair(W, 10.0)) >= mimo.sum_rate(H, W)).all())


def test_baselines_order_on_fixed_channels():
    H = mimo.rayleigh(4, 4, 0, count=20)
    P = mimo.power_of(10)
    rates = {name: float(mimo.sum_rate(H, W).mean()) for name, W in (
        ("random", mimo.random_beams((20, 4, 4), P, torch.Generator().manual_seed(0))),
        ("zf", mimo.zero_forcing(H, P)), ("mmse", mimo.mmse(H, P)),
        ("wmmse", mimo.wmmse_restarts(H, P, restarts=2)))}
    assert rates["random"] < rates["zf"] < rates["mmse"] < rates["wmmse"]


def test_corral_optimizer_is_never_below_its_wmmse_start():
    H = mimo.rayleigh(4, 4, 20, count=6)
    P = mimo.power_of(20)
    start = mimo.wmmse(H, mimo.mmse(H, P), P, iters=5)  # a weak start leaves room above it
    W = mimo.ascend(H, P, starts=4, steps=20, phases=2, polish=10, init=start)
    assert bool(mimo.feasible(W, P).all())
    assert bool((mimo.sum_rate(H, W) >= mimo.sum_rate(H, start) - 1e-9).all())  # repair: P (1 - 1e-12)
    assert float(mimo.sum_rate(H, W).mean()) > float(mimo.sum_rate(H, start).mean())


def test_one_pass_policy_on_a_tiny_budget_beats_random_beams():
    P = mimo.power_of(10)
    H = mimo.rayleigh(4, 4, 0, count=50)
    policy, info = train_policy(4, 4, P, steps=60, batch=64, seed=0, hidden=64, unroll=1)
    W = policy.act(H)
    assert info["steps"] == 60 and bool(mimo.feasible(W, P).all())
    random = mimo.sum_rate(H, mimo.random_beams((50, 4, 4), P, torch.Generator().manual_seed(0)))
    assert float(mimo.sum_rate(H, W).mean()) > float(random.mean()) + 4.0


def _policy(n, k, P, unroll=3, seed=0):
    """An untrained policy with every learned part moved off its start (so a test sees them all)."""
    torch.manual_seed(seed)
    policy = BeamPolicy(n, k, P, hidden=32, unroll=unroll)
    with torch.no_grad():
        policy.head.weight.normal_(0.0, 0.1)
        policy.theta.normal_(0.0, 0.5)
        policy.beta.uniform_(0.5, 1.8)
    return policy.eval()


@pytest.mark.parametrize("n,k", [(4, 4), (6, 3)])
def test_an_unrolled_layer_at_theta_0_beta_1_is_one_closed_form_wmmse_step(n, k):
    H = mimo.rayleigh(n, k, 3, count=4)
    P, noise = mimo.power_of(15), 1.0
    policy = _policy(n, k, P)
    gram = H @ H.mH
    X = torch.randn(4, k, k, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    W = H.mH @ X
    # the same step in the antenna space, from WMMSE's own receive step: receivers u, weights w = 1/e,
    # A = sum_j w_j |u_j|^2 h_j h_j^H + mu I with mu = noise sum_j w_j |u_j|^2 / P, beams A^-1 h_k u_k w_k
    u, _, w = mimo.wmmse_receivers(H, W, noise)
    a = u.abs().square() * w
    A = (H.mH * a.unsqueeze(-2)) @ H + (noise * a.sum(-1) / P)[:, None, None] * torch.eye(n, dtype=H.dtype)
    expect = mimo.repair(torch.linalg.solve(A, H.mH * (u * w).unsqueeze(-2)), P / (1 - 1e-12))
    zero, one = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    got = H.mH @ policy.layer(gram, X, zero, one)
    assert torch.allclose(got, expect, rtol=1e-9, atol=1e-9)
    # beta over-relaxes the step and theta scales mu: both change the beams, and the result meets the budget
    other = H.mH @ policy.layer(gram, X, torch.tensor(0.5, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64))
    assert not torch.allclose(other, expect, atol=1e-3)
    assert torch.allclose(mimo.power(other), torch.full((4,), P, dtype=torch.float64))


def test_the_structure_in_the_users_space_is_the_optimal_beam_structure():
    n, k = 5, 3
    H = mimo.rayleigh(n, k, 7, count=3)
    P = mimo.power_of(10)
    policy = _policy(n, k, P)
    gram = H @ H.mH
    lam, p = policy.parameters_of(gram)
    lam, p = lam.double(), p.double()
    got = H.mH @ policy.structure(gram)
    for b in range(3):  # w_k = sqrt(p_k) d_k / ||d_k||, d_k = (I + sum_j lambda_j h_j h_j^H)^-1 h_k (noise 1)
        T = torch.eye(n, dtype=H.dtype) + (H[b].mH * lam[b].to(H.dtype)) @ H[b]
        D = torch.linalg.solve(T, H[b].mH)
        expect = D / torch.linalg.vector_norm(D, dim=0) * p[b].sqrt()
        assert torch.allclose(got[b], expect, rtol=1e-6, atol=1e-6)  # lambda, p are float32
    assert torch.allclose(mimo.power(got), torch.full((3,), P, dtype=torch.float64))


@pytest.mark.parametrize("n,k,snr", [(4, 4, 20), (8, 5, 10)])
def test_the_one_channel_path_gives_the_batched_forwards_beams(n, k, snr):
    P = mimo.power_of(snr)
    policy = _policy(n, k, P, unroll=4, seed=n)
    H = mimo.rayleigh(n, k, 0, count=6)
    batched = policy.act(H)
    single = torch.cat([policy.act(H[i: i + 1]) for i in range(6)])  # the numpy path (float64)
    assert single.dtype == torch.complex128 and bool(mimo.feasible(single, P).all())
    assert torch.allclose(single, batched, rtol=1e-3, atol=1e-3 * math.sqrt(P))  # float32 against float64
    assert torch.allclose(mimo.sum_rate(H, single), mimo.sum_rate(H, batched), rtol=1e-4)
    with torch.no_grad():
        policy.beta.fill_(1.0)  # the exported weights follow a change once the policy is set to eval again
    policy.train().eval()
    assert not torch.allclose(policy.act(H[:1]), single[:1], atol=1e-3)
    assert torch.allclose(policy.act(H[:1]), policy.act(H[:2])[:1], rtol=1e-3, atol=1e-3 * math.sqrt(P))


def test_the_policy_reads_relative_phases_and_ignores_a_phase_on_any_users_channel():
    P = mimo.power_of(20)
    policy = _policy(5, 5, P, seed=2)
    H = mimo.rayleigh(5, 5, 4, count=3)
    turn = torch.exp(1j * torch.rand(3, 5, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    gram, turned = H @ H.mH, (turn * H) @ (turn * H).mH
    assert torch.allclose(policy.features(gram), policy.features(turned), atol=1e-5)
    assert torch.allclose(mimo.sum_rate(H, policy.act(H)), mimo.sum_rate(turn * H, policy.act(turn * H)), rtol=1e-4)
    # the magnitudes alone are the same for a channel with user 2's relative phase flipped; the input is not
    flipped = gram.clone()
    flipped[:, 1, 2], flipped[:, 2, 1] = gram[:, 1, 2].conj(), gram[:, 2, 1].conj()
    assert torch.allclose(flipped.abs(), gram.abs())
    assert not torch.allclose(policy.features(flipped), policy.features(gram), atol=1e-3)


def test_problem_check_recomputes_the_rate_and_refuses_an_over_budget_set():
    p = mimo.load_mimo("rayleigh:N=3,K=2,snr=10,seed=1")
    W = mimo.mmse(p.H, p.P)
    assert p.check(W) == pytest.approx(float(mimo.sum_rate(p.H, W)))
    with pytest.raises(InfeasibleSolution, match="over the budget"):
        p.check(W * 2)
    with pytest.raises(InfeasibleSolution, match="shape"):
        p.check(W.T)


@pytest.mark.parametrize("spec", ["gauss:N=4", "rayleigh:K=4", "rayleigh:N=4,snr=x", "rayleigh:N=0"])
def test_bad_instance_specs_are_refused_with_the_format(spec):
    with pytest.raises(UserError, match="rayleigh:N=8"):
        mimo.parse_spec(spec) if spec != "rayleigh:N=0" else mimo.load_mimo(spec)


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="corral")
    add_solve_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


def test_cli_solves_a_channel_and_writes_beams_that_check(tmp_path, capsys):
    out = tmp_path / "beams.txt"
    spec = "rayleigh:N=4,K=4,snr=10,seed=0"
    assert run_cli(["solve", "mimo", spec, "--seconds", "2", "--envs", "4", "--out", str(out), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    p = mimo.load_mimo(spec)
    vals = torch.tensor([[float(v) for v in line.split()] for line in out.read_text().splitlines()],
                        dtype=torch.float64)
    W = torch.view_as_complex(vals.reshape(4, 4, 2).contiguous())
    assert rec["method"] == "corral" and p.check(W) == pytest.approx(rec["value"], rel=1e-12)
    wm = mimo.sum_rate(p.H, mimo.wmmse_restarts(p.H[None], p.P, restarts=8))
    assert rec["value"] >= float(wm) - 1e-9
    assert run_cli(["solve", "mimo", spec, "--method", "zf", "--out", "-"]) == 0
    assert "sum rate" in capsys.readouterr().out
