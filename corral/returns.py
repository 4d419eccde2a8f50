"""Returns math: the one tested implementation of discounted returns, GAE and V-trace.

Every function takes tensors shaped ``[T, N]`` (time, env) and keeps
``terminated`` and ``truncated`` apart:

* ``terminated[t]``: the episode ended at step t for a reason inside the MDP;
  the value after it is zero.
* ``truncated[t]``: the episode was cut (time limit); the value after it is
  ``V(final_obs)``, passed in as ``final_values[t]``. The rollout then continues
  with a new episode, so nothing flows back across the boundary.

``next_values[t]`` is the value of the observation that follows step t *within
the same episode*: ``V(obs[t+1])`` normally, ``V(final_obs[t])`` on truncation,
anything on termination (it is masked). ``rollout_next_values`` builds it.
"""

from __future__ import annotations

import torch


def rollout_next_values(
    values: torch.Tensor,
    last_value: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
) -> torch.Tensor:
    """Value of the state after each step: V(obs[t+1]), or V(final_obs[t]) where truncated."""
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)], dim=0)
    return torch.where(truncated, final_values, next_values)


def discounted_returns(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    next_values: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Bootstrapped discounted returns G_t = r_t + gamma * (1-term_t) * [G_{t+1} or V_next]."""
    T = rewards.shape[0]
    returns = torch.empty_like(rewards)
    not_term = (~terminated).to(rewards.dtype)
    # At an episode boundary (either kind) the continuation is the bootstrap value,
    # not the next return in the buffer, which belongs to a new episode.
    cut = (terminated | truncated)
    running = next_values[T - 1]
    for t in range(T - 1, -1, -1):
        running = torch.where(cut[t], next_values[t], running)
        running = rewards[t] + gamma * not_term[t] * running
        returns[t] = running
    return returns


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, eq. 16).

    delta_t = r_t + gamma * (1 - term_t) * next_values_t - V_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    Returns ``(advantages, returns = advantages + values)``.
    """
    not_term = (~terminated).to(rewards.dtype)
    not_done = (~(terminated | truncated)).to(rewards.dtype)
    deltas = rewards + gamma * not_term * next_values - values
    decay = gamma * lam * not_done
    adv = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + decay[t] * running
        adv[t] = running
    return adv, adv + values


def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets (Espeholt et al. 2018, eq. 1) and policy-gradient advantages.

    ``log_rhos = log pi(a|x) - log mu(a|x)``. Returns ``(vs, pg_advantages)`` with
    pg_advantages_t = rho_t * (r_t + gamma * (1-term_t) * v_{s+1} - V(x_t)).
    """
    rhos = log_rhos.exp()
    clipped_rhos = rhos.clamp(max=rho_bar)
    cs = rhos.clamp(max=c_bar)
    not_term = (~terminated).to(rewards.dtype)
    not_done = (~(terminated | truncated)).to(rewards.dtype)
    deltas = clipped_rhos * (rewards + gamma * not_term * next_values - values)
    acc = torch.zeros_like(rewards[0])
    vs_minus_v = torch.empty_like(rewards)
    for t in range(rewards.shape[0] - 1, -1, -1):
        acc = deltas[t] + gamma * not_done[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    # v_{s+1}: the V-trace target of the next state in the same episode; at an
    # episode boundary it is the bootstrap value itself.
    vs_next = torch.cat([vs[1:], next_values[-1:]], dim=0)
    vs_next = torch.where((terminated | truncated), next_values, vs_next)
    pg_adv = clipped_rhos * (rewards + gamma * not_term * vs_next - values)
    return vs, pg_adv


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """R2D2's (Kapturowski et al. 2019; Pohlen et al. 2018) invertible value squashing
    ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``: targets are ``h(r + gamma h^-1(Q))``."""
    return x.sign() * ((x.abs() + 1.0).sqrt() - 1.0) + eps * x


def value_unrescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The inverse of :func:`value_rescale`:
    ``h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``."""
    return x.sign() * ((((1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)).sqrt() - 1.0) / (2.0 * eps)).square() - 1.0)
