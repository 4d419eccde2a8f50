"""Returns math against hand-worked arrays, a plain Python loop and known answers."""

import math
import random

import pytest
import torch

from corral.returns import discounted_returns, gae, rollout_next_values, vtrace


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype).reshape(-1, 1)


def b(x):
    return torch.tensor(x, dtype=torch.bool).reshape(-1, 1)


def reference_gae(rewards, values, next_values, term, trunc, gamma, lam):
    """Plain Python, one env, written from the paper's definitions."""
    T = len(rewards)
    adv = [0.0] * T
    running = 0.0
    for i in reversed(range(T)):
        if term[i] or trunc[i]:
            running = 0.0
        boot = 0.0 if term[i] else next_values[i]
        delta = rewards[i] + gamma * boot - values[i]
        running = delta + gamma * lam * running
        adv[i] = running
    return adv


def test_gae_matches_hand_worked_values_with_truncation_in_the_middle():
    # 4 steps, gamma=0.5, lam=0.5; truncation after step 1 (final obs value 10),
    # rollout ends after step 3 with bootstrap value 4.
    rewards = t([1.0, 2.0, 3.0, 4.0])
    values = t([0.0, 1.0, 2.0, 3.0])
    truncated = b([False, True, False, False])
    terminated = b([False, False, False, False])
    final_values = t([0.0, 10.0, 0.0, 0.0])
    nv = rollout_next_values(values, t([4.0])[0], truncated, final_values)
    assert nv.flatten().tolist() == [1.0, 10.0, 3.0, 4.0]
    adv, ret = gae(rewards, values, nv, terminated, truncated, gamma=0.5, lam=0.5)
    # deltas: d3 = 4+0.5*4-3 = 3; d2 = 3+0.5*3-2 = 2.5; d1 = 2+0.5*10-1 = 6; d0 = 1+0.5*1-0 = 1.5
    # A3 = 3; A2 = 2.5 + 0.25*3 = 3.25; A1 = 6 (episode cut); A0 = 1.5 + 0.25*6 = 3.0
    assert adv.flatten().tolist() == pytest.approx([3.0, 6.0, 3.25, 3.0])
    assert ret.flatten().tolist() == pytest.approx([3.0, 7.0, 5.25, 6.0])


def test_gae_does_not_bootstrap_after_termination():
    rewards = t([1.0, 1.0])
    values = t([5.0, 5.0])
    terminated = b([True, False])
    truncated = b([False, False])
    nv = rollout_next_values(values, t([7.0])[0], truncated, t([0.0, 0.0]))
    adv, _ = gae(rewards, values, nv, terminated, truncated, gamma=0.9, lam=1.0)
    assert adv[0, 0].item() == pytest.approx(1.0 - 5.0)  # no gamma*V after termination
    assert adv[1, 0].item() == pytest.approx(1.0 + 0.9 * 7.0 - 5.0)


def test_gae_matches_a_plain_python_loop_on_random_rollouts():
    rng = random.Random(0)
    T, N = 37, 5
    rewards = torch.randn(T, N, dtype=torch.float64)
    values = torch.randn(T, N, dtype=torch.float64)
    final_values = torch.randn(T, N, dtype=torch.float64)
    term = torch.tensor([[rng.random() < 0.1 for _ in range(N)] for _ in range(T)])
    trunc = torch.tensor([[rng.random() < 0.1 for _ in range(N)] for _ in range(T)]) & ~term
    last = torch.randn(N, dtype=torch.float64)
    nv = rollout_next_values(values, last, trunc, final_values)
    adv, ret = gae(rewards, values, nv, term, trunc, 0.97, 0.9)
    for j in range(N):
        ref = reference_gae(rewards[:, j].tolist(), values[:, j].tolist(), nv[:, j].tolist(),
                            term[:, j].tolist(), trunc[:, j].tolist(), 0.97, 0.9)
        assert adv[:, j].tolist() == pytest.approx(ref)
    assert torch.allclose(ret, adv + values)


def test_gae_with_lambda_one_equals_discounted_returns_minus_values():
    T, N = 20, 3
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    term = torch.rand(T, N, generator=g) < 0.15
    trunc = (torch.rand(T, N, generator=g) < 0.15) & ~term
    nv = rollout_next_values(values, torch.randn(N, generator=g, dtype=torch.float64), trunc,
                             torch.randn(T, N, generator=g, dtype=torch.float64))
    adv, _ = gae(rewards, values, nv, term, trunc, 0.9, 1.0)
    ret = discounted_returns(rewards, term, trunc, nv, 0.9)
    assert torch.allclose(adv, ret - values)


def test_discounted_returns_of_constant_reward_reach_the_geometric_sum():
    T = 200
    rewards = torch.ones(T, 1, dtype=torch.float64)
    flags = torch.zeros(T, 1, dtype=torch.bool)
    ret = discounted_returns(rewards, flags, flags, torch.zeros(T, 1, dtype=torch.float64), 0.9)
    assert ret[0, 0].item() == pytest.approx((1 - 0.9**T) / (1 - 0.9))


def reference_vtrace(log_rhos, rewards, values, next_values, term, trunc, gamma, rho_bar, c_bar):
    """Plain Python, one env, from Espeholt et al. 2018 as written: eq. 1 as the explicit sum

        v_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t V,
        delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),

    with e the episode's (or the rollout's) last step, V(x_{t+1}) = 0 after termination, and
    the policy-gradient advantage rho_s (r_s + gamma v_{s+1} - V(x_s)) with v_{s+1} the next
    state's target (its bootstrap value at an episode or rollout end)."""
    T = len(rewards)
    rho = [min(rho_bar, math.exp(x)) for x in log_rhos]
    c = [min(c_bar, math.exp(x)) for x in log_rhos]
    boot = [0.0 if term[t] else next_values[t] for t in range(T)]
    delta = [rho[t] * (rewards[t] + gamma * boot[t] - values[t]) for t in range(T)]
    vs = []
    for s in range(T):
        total, weight, t = 0.0, 1.0, s
        while True:
            total += weight * delta[t]
            if term[t] or trunc[t] or t == T - 1:
                break
            weight *= gamma * c[t]
            t += 1
        vs.append(values[s] + total)
    pg = []
    for s in range(T):
        v_next = boot[s] if (term[s] or trunc[s] or s == T - 1) else vs[s + 1]
        pg.append(rho[s] * (rewards[s] + gamma * v_next - values[s]))
    return vs, pg


@pytest.mark.parametrize("off_policy", [False, True])
def test_vtrace_matches_the_papers_sum_on_random_rollouts(off_policy):
    T, N = 23, 4
    g = torch.Generator().manual_seed(2)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    term = torch.rand(T, N, generator=g) < 0.1
    trunc = (torch.rand(T, N, generator=g) < 0.1) & ~term
    nv = rollout_next_values(values, torch.randn(N, generator=g, dtype=torch.float64), trunc,
                             torch.randn(T, N, generator=g, dtype=torch.float64))
    # off-policy: ratios from about 0.2 to 5, so both clips (rho_bar 1.2, c_bar 0.9) bite
    log_rhos = (torch.rand(T, N, generator=g, dtype=torch.float64) * 3.2 - 1.6) if off_policy \
        else torch.zeros(T, N, dtype=torch.float64)
    rho_bar, c_bar = (1.2, 0.9) if off_policy else (1.0, 1.0)
    vs, pg_adv = vtrace(log_rhos, rewards, values, nv, term, trunc, 0.95, rho_bar, c_bar)
    for j in range(N):
        ref_vs, ref_pg = reference_vtrace(log_rhos[:, j].tolist(), rewards[:, j].tolist(), values[:, j].tolist(),
                                          nv[:, j].tolist(), term[:, j].tolist(), trunc[:, j].tolist(), 0.95,
                                          rho_bar, c_bar)
        assert vs[:, j].tolist() == pytest.approx(ref_vs, rel=1e-9, abs=1e-12)
        assert pg_adv[:, j].tolist() == pytest.approx(ref_pg, rel=1e-9, abs=1e-12)
    if not off_policy:
        # Espeholt et al. 2018, remark 1: on-policy with c_bar = 1, the targets are n-step returns
        assert torch.allclose(vs, discounted_returns(rewards, term, trunc, nv, 0.95))


def test_vtrace_hand_worked_three_steps_with_a_termination_and_both_clips():
    # one env, gamma = 0.5, rho_bar = 1.5, c_bar = 0.5; rhos = [2, 0.25, 4]; termination after step 1
    # clipped rho = [1.5, 0.25, 1.5], c = [0.5, 0.25, 0.5]
    log_rhos = torch.log(torch.tensor([[2.0], [0.25], [4.0]], dtype=torch.float64))
    rewards, values = t([1.0, 2.0, 1.0]), t([1.0, 2.0, 3.0])
    nv = t([2.0, 9.0, 4.0])  # V(x1) = 2; after step 1 masked (terminated); bootstrap V(x3) = 4
    vs, pg = vtrace(log_rhos, rewards, values, nv, b([False, True, False]), b([False, False, False]),
                    gamma=0.5, rho_bar=1.5, c_bar=0.5)
    # delta0 = 1.5 (1 + 0.5 * 2 - 1) = 1.5 ; delta1 = 0.25 (2 + 0 - 2) = 0 ; delta2 = 1.5 (1 + 0.5 * 4 - 3) = 0
    # vs2 = 3 + 0 = 3 ; vs1 = 2 + 0 = 2 (the episode ends) ; vs0 = 1 + 1.5 + 0.5 * 0.5 * 0 = 2.5
    assert vs.flatten().tolist() == pytest.approx([2.5, 2.0, 3.0])
    # pg0 = 1.5 (1 + 0.5 * vs1 - 1) = 1.5 ; pg1 = 0.25 (2 + 0 - 2) = 0 ; pg2 = 1.5 (1 + 0.5 * 4 - 3) = 0
    assert pg.flatten().tolist() == pytest.approx([1.5, 0.0, 0.0])
    # the same with a nonzero TD error after the boundary, so c0 carries it into vs0 only within the episode
    rewards2 = t([1.0, 4.0, 3.0])
    vs2, pg2 = vtrace(log_rhos, rewards2, values, nv, b([False, True, False]), b([False, False, False]),
                      gamma=0.5, rho_bar=1.5, c_bar=0.5)
    # delta1 = 0.25 (4 - 2) = 0.5 ; delta2 = 1.5 (3 + 2 - 3) = 3 ; vs2 = 6 ; vs1 = 2.5 ; vs0 = 1 + 1.5 + 0.25 * 0.5 = 2.625
    assert vs2.flatten().tolist() == pytest.approx([2.625, 2.5, 6.0])
    # pg0 = 1.5 (1 + 0.5 * 2.5 - 1) = 1.875 ; pg1 = 0.25 (4 - 2) = 0.5 ; pg2 = 1.5 (3 + 2 - 3) = 3
    assert pg2.flatten().tolist() == pytest.approx([1.875, 0.5, 3.0])


def test_vtrace_hand_worked_two_steps_with_clipping():
    # T=2, one env, gamma=1: rhos = [2, 0.5] -> clipped rho = [1, 0.5], c = [1, 0.5]
    log_rhos = torch.log(torch.tensor([[2.0], [0.5]], dtype=torch.float64))
    rewards = t([1.0, 1.0])
    values = t([0.0, 0.0])
    nv = t([0.0, 2.0])  # V(x1)=0, bootstrap V(x2)=2
    flags = b([False, False])
    vs, pg = vtrace(log_rhos, rewards, values, nv, flags, flags, gamma=1.0)
    # delta1 = 0.5*(1 + 2 - 0) = 1.5 ; vs1 = 0 + 1.5 = 1.5
    # delta0 = 1*(1 + 0 - 0) = 1 ; vs0 = 0 + 1 + 1*c0*(vs1 - V1) = 1 + 1.5 = 2.5
    assert vs.flatten().tolist() == pytest.approx([2.5, 1.5])
    # pg0 = rho0_clip*(r0 + vs1 - V0) = 1*(1+1.5) = 2.5 ; pg1 = 0.5*(1 + 2 - 0) = 1.5
    assert pg.flatten().tolist() == pytest.approx([2.5, 1.5])
