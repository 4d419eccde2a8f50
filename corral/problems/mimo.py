"""MIMO downlink beamforming: maximize the sum rate of K single-antenna users served by N antennas.

Notation (one channel; every function takes a batch ``[B, ...]``):

* ``H [K, N]`` complex, row k is ``h_k^H``: user k receives ``y_k = h_k^H sum_j w_j s_j + n_k``,
  ``n_k ~ CN(0, sigma^2)``. Rayleigh channels: every entry CN(0, 1) (real and imaginary parts
  N(0, 1/2)), drawn from a fixed seed (:func:`rayleigh`).
* ``W [N, K]`` complex, column k is user k's beam ``w_k``; ``G = H W``, ``G[k, j] = h_k^H w_j``.
* sum rate ``sum_k log2(1 + |G_kk|^2 / (sum_{j != k} |G_kj|^2 + sigma^2))`` (bits/s/Hz) under the
  total power constraint ``sum_k ||w_k||^2 = ||W||_F^2 <= P``. With ``sigma^2 = 1``, the SNR in dB
  sets ``P = 10^(snr / 10)``. Scaling every beam up raises every SINR, so the repair of an
  infeasible (or under-powered) beam set scales it to the budget.

Baselines: zero-forcing (:func:`zero_forcing`, water-filling over the users' effective gains),
regularized ZF / MMSE (:func:`mmse`, ``(H^H H + K sigma^2 / P I)^-1 H^H``, equal power per user)
and WMMSE (:func:`wmmse`, Shi, Razaviyayn, Luo, He 2011, from its update equations, with the
power multiplier found by bisection; random, ZF and MMSE starts). corral's per-instance
optimizer (:func:`ascend`) and the one-pass policy (:mod:`corral.problems.mimo_policy`) are
compared against them by ``benchmarks/bench_mimo.py``; :func:`corral.problems.mimo_solve.solve_mimo` runs any of them for
``corral solve mimo``.
"""

from __future__ import annotations

import math
import time

import torch

from corral.errors import UserError
from corral.problems.base import InfeasibleSolution, Problem

LN2 = math.log(2.0)
POWER_TOL = 1e-6  # relative slack of the power check (float rounding of a scaled beam set)

# ------------------------------------------------------------------------------------ instances


def rayleigh(n: int, k: int, seed: int = 0, count: int = 1, dtype=torch.complex128) -> torch.Tensor:
    """``count`` channels ``[count, K, N]``, channel i drawn from seed ``seed + i`` alone (so
    ``rayleigh(n, k, 5)`` is the 6th channel of ``rayleigh(n, k, 0, count=100)``)."""
    out = torch.empty(count, k, n, dtype=dtype)
    for i in range(count):
        g = torch.Generator().manual_seed(int(seed) + i)
        re = torch.randn(k, n, generator=g, dtype=torch.float64)
        im = torch.randn(k, n, generator=g, dtype=torch.float64)
        out[i] = torch.complex(re, im).to(dtype) / math.sqrt(2.0)
    return out


def parse_spec(spec: str) -> dict:
    """``rayleigh:N=8,K=8,snr=10,seed=0`` -> ``{"n": 8, "k": 8, "snr": 10.0, "seed": 0}`` (K
    defaults to N, snr to 10 dB, seed to 0)."""
    usage = "use rayleigh:N=8,K=8,snr=10,seed=0 (K defaults to N, snr to 10 dB, seed to 0)"
    if not spec.startswith("rayleigh:"):
        raise UserError(f"mimo instance {spec!r} is not a channel spec; {usage}")
    out: dict = {"snr": 10.0, "seed": 0}
    try:
        for part in filter(None, spec.split(":", 1)[1].split(",")):
            key, value = part.split("=")
            key = key.strip().lower()
            if key not in ("n", "k", "snr", "seed"):
                raise ValueError
            out[key] = float(value) if key == "snr" else int(value)
    except ValueError:
        raise UserError(f"mimo instance {spec!r}: cannot read it; {usage}") from None
    if "n" not in out:
        raise UserError(f"mimo instance {spec!r} names no antenna count N; {usage}")
    out.setdefault("k", out["n"])
    if out["n"] < 1 or out["k"] < 1:
        raise UserError(f"mimo instance {spec!r}: N and K must be >= 1; {usage}")
    return out


# ------------------------------------------------------------------------------------ objective


def power_of(snr_db: float) -> float:
    """Total transmit power for an SNR in dB at noise power 1."""
    return 10.0 ** (snr_db / 10.0)


def sum_rate(H: torch.Tensor, W: torch.Tensor, noise: float = 1.0) -> torch.Tensor:
    """Sum rate (bits/s/Hz) of beams ``W [..., N, K]`` on channels ``H [..., K, N]``: ``[...]``."""
    g2 = (H @ W).abs().square()  # [..., K, K], |h_k^H w_j|^2
    signal = torch.diagonal(g2, dim1=-2, dim2=-1)
    interference = g2.sum(-1) - signal
    return torch.log2(1.0 + signal / (interference + noise)).sum(-1)


def power(W: torch.Tensor) -> torch.Tensor:
    """Total transmit power ``||W||_F^2`` ``[...]``."""
    return W.abs().square().sum((-2, -1))


def feasible(W: torch.Tensor, P: float) -> torch.Tensor:
    """True where the beams meet the power budget (with a relative slack of ``POWER_TOL``)."""
    return power(W) <= P * (1.0 + POWER_TOL)


def repair(W: torch.Tensor, P: float) -> torch.Tensor:
    """Every beam set scaled to total power ``P`` (never worse: a common scale-up raises every
    SINR); an all-zero or non-finite set becomes ``sqrt(P / (N K))`` in every entry."""
    p = power(W)
    zero = ~(p > 0) | ~torch.isfinite(p)
    W = torch.where(zero[..., None, None], torch.full_like(W, math.sqrt(P / (W.shape[-1] * W.shape[-2]))), W)
    p = power(W)
    return W * torch.sqrt(P * (1.0 - 1e-12) / p)[..., None, None]


# ------------------------------------------------------------------------------------ linear beams


def zf_directions(H: torch.Tensor) -> torch.Tensor:
    """Unit-norm zero-forcing directions ``H^H (H H^H)^-1`` column-normalized; ``[..., N, K]``."""
    Hh = H.mH
    D = Hh @ torch.linalg.inv(H @ Hh)
    return D / torch.linalg.vector_norm(D, dim=-2, keepdim=True)


def water_fill(gains: torch.Tensor, P: float, noise: float = 1.0) -> torch.Tensor:
    """Powers ``p [..., K]`` maximizing ``sum log(1 + g_k p_k / noise)`` with ``sum p = P``."""
    inv = noise / gains  # [..., K]
    srt, _ = torch.sort(inv, dim=-1)
    K = inv.shape[-1]
    csum = torch.cumsum(srt, -1)
    m = torch.arange(1, K + 1, dtype=inv.dtype, device=inv.device)
    level = (P + csum) / m  # water level if the m best users are active
    active = level > srt
    # the largest m whose level is above its m-th floor
    m_star = (active * m).amax(-1, keepdim=True).long()
    mu = torch.gather(level, -1, m_star - 1)
    return (mu - inv).clamp_min(0.0)


def zero_forcing(H: torch.Tensor, P: float, noise: float = 1.0) -> torch.Tensor:
    """ZF beams with water-filling power (the best powers for ZF directions: the users see
    interference-free gains ``|h_k^H d_k|^2``)."""
    D = zf_directions(H)
    gains = torch.diagonal(H @ D, dim1=-2, dim2=-1).abs().square()
    p = water_fill(gains, P, noise)
    return D * p.sqrt().unsqueeze(-2).to(D.dtype)


def mmse(H: torch.Tensor, P: float, noise: float = 1.0) -> torch.Tensor:
    """Regularized ZF / MMSE beams ``H^H (H H^H + K noise / P I)^-1``, columns normalized, equal
    power ``P / K`` per user."""
    K = H.shape[-2]
    Hh = H.mH
    eye = torch.eye(K, dtype=H.dtype, device=H.device)
    D = Hh @ torch.linalg.inv(H @ Hh + (K * noise / P) * eye)
    D = D / torch.linalg.vector_norm(D, dim=-2, keepdim=True)
    return D * math.sqrt(P / K)


def random_beams(shape, P: float, gen: torch.Generator | None = None, dtype=torch.complex128) -> torch.Tensor:
    """Random CN(0, 1) beams ``[*shape]`` scaled to total power ``P``."""
    W = torch.randn(*shape, generator=gen, dtype=dtype)
    return repair(W, P)


# ------------------------------------------------------------------------------------ WMMSE


def wmmse_receivers(H: torch.Tensor, W: torch.Tensor, noise: float = 1.0):
    """The WMMSE receive step: MMSE receivers ``u [..., K]``, their MSEs ``e`` and the weights
    ``w = 1 / e`` (Shi et al. 2011, eqs. for U_k and W_k with single-antenna users)."""
    G = H @ W
    g = torch.diagonal(G, dim1=-2, dim2=-1)
    total = G.abs().square().sum(-1) + noise
    u = g / total
    e = (1.0 - (u.conj() * g).real).clamp_min(1e-300)
    return u, e, 1.0 / e


def wmmse_objective(H, W, u, w, noise: float = 1.0) -> torch.Tensor:
    """The weighted-MSE objective ``sum_k (w_k e_k(u_k, W) - ln w_k)`` that WMMSE descends."""
    G = H @ W
    g = torch.diagonal(G, dim1=-2, dim2=-1)
    total = G.abs().square().sum(-1) + noise
    e = u.abs().square() * total - 2.0 * (u.conj() * g).real + 1.0
    return (w * e - torch.log(w)).sum(-1)


def wmmse_transmit(H, u, w, P: float, iters: int = 60):
    """The WMMSE transmit step: ``w_k = (A + mu I)^-1 h_k u_k w_k`` with
    ``A = sum_j |u_j|^2 w_j h_j h_j^H`` and the smallest ``mu >= 0`` meeting ``||W||^2 <= P``
    (``mu`` by bisection on the power, diagonalized through ``A``'s eigenvectors). Returns
    ``(W, mu)``."""
    Hh = H.mH  # [..., N, K], column k is h_k
    A = (Hh * (u.abs().square() * w).unsqueeze(-2).to(H.dtype)) @ H
    B = Hh * (u * w).unsqueeze(-2)
    lam, D = torch.linalg.eigh(A)
    lam = lam.clamp_min(0.0)
    c = (D.mH @ B).abs().square().sum(-1)  # [..., N]: power(mu) = sum_n c_n / (lam_n + mu)^2

    def pw(mu):
        return (c / (lam + mu.unsqueeze(-1)).square()).sum(-1)

    zero = torch.zeros(lam.shape[:-1], dtype=lam.dtype, device=lam.device)
    ok0 = (lam.amin(-1) > 1e-12 * lam.amax(-1).clamp_min(1e-300)) & (pw(zero) <= P)
    lo, hi = zero.clone(), torch.sqrt(c.sum(-1) / P) + 1e-12  # power(hi) <= P
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        over = pw(mid) > P
        lo = torch.where(over, mid, lo)
        hi = torch.where(over, hi, mid)
    mu = torch.where(ok0, zero, hi)
    W = D @ ((D.mH @ B) / (lam + mu.unsqueeze(-1)).unsqueeze(-1).to(B.dtype))
    return W, mu


def wmmse(H: torch.Tensor, W0: torch.Tensor, P: float, noise: float = 1.0, iters: int = 300,
          tol: float = 1e-6) -> torch.Tensor:
    """Run WMMSE from beams ``W0`` (``[..., N, K]``, broadcast over H's batch) until the sum rate
    of every row changes by less than ``tol`` (relative) or ``iters`` iterations; returns the
    beams. Each iteration: receivers and weights from the beams, then the beams from them."""
    W = W0
    rate = sum_rate(H, W, noise)
    for _ in range(iters):
        u, _, w = wmmse_receivers(H, W, noise)
        W, _ = wmmse_transmit(H, u, w, P)
        new = sum_rate(H, W, noise)
        done = bool(((new - rate).abs() <= tol * new.abs().clamp_min(1e-9)).all())
        rate = new
        if done:
            break
    return W


def wmmse_restarts(H: torch.Tensor, P: float, restarts: int = 8, seed: int = 0, noise: float = 1.0,
                   iters: int = 300) -> torch.Tensor:
    """WMMSE from a ZF start, an MMSE start and ``restarts`` random starts per channel, all in one
    batch; the best beams per channel ``[B, N, K]``."""
    B, K, N = H.shape
    gen = torch.Generator().manual_seed(seed)
    starts = [zero_forcing(H, P, noise).unsqueeze(1), mmse(H, P, noise).unsqueeze(1)]
    if restarts:
        starts.append(random_beams((B, restarts, N, K), P, gen, H.dtype))
    W0 = torch.cat(starts, 1)  # [B, S, N, K]
    W = wmmse(H.unsqueeze(1), W0, P, noise, iters)
    return _best(H, W, noise)


def _best(H, W, noise):
    """The best of ``W [B, S, N, K]`` per channel."""
    r = sum_rate(H.unsqueeze(1), W, noise)
    i = r.argmax(1)
    return W[torch.arange(W.shape[0]), i]


# ------------------------------------------------------------------------------------ corral's optimizer


def ascend(H: torch.Tensor, P: float, starts: int = 32, steps: int = 100, phases: int = 3, lr: float = 0.05,
           keep: float = 0.25, jitter: float = 0.3, polish: int = 30, seed: int = 0, noise: float = 1.0,
           init: torch.Tensor | None = None, deadline: float | None = None) -> torch.Tensor:
    """corral's per-instance optimizer; returns the best beams found per channel ``[B, N, K]``.

    ``starts`` starts per channel (ZF, MMSE, random) in one batch, ``phases`` rounds of: gradient
    ascent on the sum rate (``steps`` Adam steps on the beams' real and imaginary parts, cosine
    learning rate, the power budget met by scaling in the forward pass); ``polish`` WMMSE
    iterations on every start (monotone in the sum rate: it settles each start in its basin);
    the best so far per channel kept; then the worst half of the starts restart from the elites
    (the best ``keep`` fraction) with complex Gaussian jitter of relative size ``jitter``.
    ``init`` (beams ``[B, N, K]``, e.g. WMMSE's) takes the first start's place and is the first
    best so far, so the result is never worse than it on any channel. ``deadline`` (a
    ``perf_counter`` time) ends the search after the current phase's ascent."""
    B, K, N = H.shape
    gen = torch.Generator().manual_seed(seed)
    Hs = H.unsqueeze(1)
    W = torch.cat([zero_forcing(H, P, noise).unsqueeze(1), mmse(H, P, noise).unsqueeze(1),
                   random_beams((B, max(0, starts - 2), N, K), P, gen, H.dtype)], 1)[:, :starts]
    if init is not None:
        W = torch.cat([repair(init, P).unsqueeze(1), W[:, : starts - 1]], 1)
    best_w, best_r = W[:, 0].clone(), sum_rate(H, W[:, 0], noise)
    scale = math.sqrt(P)
    rows = torch.arange(B).unsqueeze(1)
    for phase in range(phases):
        W = _adam(Hs, W, P, steps, lr, noise, deadline)
        with torch.no_grad():
            W = wmmse(Hs, W, P, noise, iters=polish)
            rate = sum_rate(Hs, W, noise)
            top, arg = rate.max(1)
            better = top > best_r
            best_w = torch.where(better[:, None, None], W[rows[:, 0], arg], best_w)
            best_r = torch.maximum(top, best_r)
            if phase == phases - 1 or (deadline is not None and time.perf_counter() > deadline):
                break
            order = rate.argsort(1, descending=True)
            n_elite = max(1, int(keep * starts))
            elite = W[rows, order[:, :n_elite]]  # [B, E, N, K]
            worst = order[:, starts // 2:]
            base = elite[rows, torch.randint(n_elite, worst.shape, generator=gen)]
            kick = torch.randn(base.shape, generator=gen, dtype=H.dtype) * (jitter * scale / math.sqrt(N * K))
            W[rows, worst] = repair(base + kick, P)
    return best_w


def _adam(Hs, W, P, steps, lr, noise, deadline):
    """``steps`` Adam steps of gradient ascent on the sum rate from beams ``W [B, S, N, K]``."""
    scale = math.sqrt(P)
    Z = torch.view_as_real(W / scale).clone().requires_grad_(True)
    opt = torch.optim.Adam([Z], lr=lr)
    for t in range(steps):
        for group in opt.param_groups:  # cosine decay within the phase
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * t / steps))
        V = torch.view_as_complex(Z)
        V = V * (scale / power(V).sqrt())[..., None, None]
        loss = -sum_rate(Hs, V, noise).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if deadline is not None and time.perf_counter() > deadline:
            break
    return repair(torch.view_as_complex(Z.detach()), P)


# ------------------------------------------------------------------------------------ the problem


class MimoProblem(Problem):
    """One channel ``H [K, N]`` at power ``P`` (noise 1). The search works on beams ``W [B, N, K]``
    (complex): ``score`` is the sum rate, ``feasible`` the power check, ``repair`` the scaling to
    the budget. A solution is ``W [N, K]`` (complex128) and ``check`` recomputes its sum rate."""

    kind = "mimo"

    def __init__(self, H: torch.Tensor, snr: float, name: str = "channel", noise: float = 1.0):
        self.H = H.to(torch.complex128).reshape(H.shape[-2:])
        self.k, self.n_antennas = self.H.shape
        self.snr, self.P, self.noise, self.name = float(snr), power_of(snr), float(noise), name
        self.n = 2 * self.k * self.n_antennas  # real variables

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return sum_rate(self.H, x, self.noise)

    def feasible(self, x: torch.Tensor) -> torch.Tensor:
        return feasible(x, self.P)

    def repair(self, x, keep=None, gen=None):
        return repair(x, self.P)

    def random(self, batch: int, gen: torch.Generator | None = None) -> torch.Tensor:
        return random_beams((batch, self.n_antennas, self.k), self.P, gen)

    def export(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().to("cpu", torch.complex128).reshape(self.n_antennas, self.k)

    def check(self, solution) -> float:
        W = torch.as_tensor(solution).to(torch.complex128)
        if W.shape != (self.n_antennas, self.k):
            raise InfeasibleSolution(f"mimo {self.name}: beams of shape {tuple(W.shape)}, the channel needs "
                                     f"({self.n_antennas}, {self.k}) (antennas x users)")
        if not bool(torch.isfinite(torch.view_as_real(W)).all()):
            raise InfeasibleSolution(f"mimo {self.name}: the beams hold a non-finite entry")
        if not bool(feasible(W, self.P)):
            raise InfeasibleSolution(f"mimo {self.name}: the beams' total power {float(power(W)):.6g} is over "
                                     f"the budget P = {self.P:.6g}")
        return float(sum_rate(self.H, W, self.noise))

    def describe(self) -> dict:
        return {"antennas": self.n_antennas, "users": self.k, "snr": self.snr, "power": self.P}


def load_mimo(spec: str) -> MimoProblem:
    """The channel named by a spec such as ``rayleigh:N=8,K=8,snr=10,seed=0``."""
    s = parse_spec(spec)
    H = rayleigh(s["n"], s["k"], s["seed"])[0]
    return MimoProblem(H, s["snr"], name=f"rayleigh_N{s['n']}_K{s['k']}_snr{s['snr']:g}_s{s['seed']}")


def write_beams(W: torch.Tensor, path) -> None:
    """Beams ``[N, K]`` as text: line i holds antenna i's ``re im`` pair for each user."""
    from pathlib import Path

    rows = torch.view_as_real(W.to(torch.complex128)).reshape(W.shape[0], -1).tolist()
    Path(path).write_text("".join(" ".join(f"{v:.17g}" for v in row) + "\n" for row in rows))
