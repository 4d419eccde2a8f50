"""A trained policy that maps a channel to beams in one forward pass (RLSolver's pretrained
networks for real-time inference), trained without labels: the loss is the negative sum rate.

The network does not output raw beams. It outputs the two vectors of the optimal beamforming
structure (Bjornson, Bengtsson, Ottersten 2014; the form Xia et al. 2020 learn): with dual
powers ``lambda`` and powers ``p`` (each ``>= 0`` summing to ``P``), every sum-rate optimum is

    w_k = sqrt(p_k) d_k / ||d_k||,   d_k = (I + sum_j lambda_j / sigma^2 h_j h_j^H)^-1 h_k

followed by ``unroll`` refinement layers, each one WMMSE-style step with the power multiplier in
closed form instead of a bisection (Christensen et al. 2008: ``mu = sigma^2 sum_k w_k |u_k|^2 / P``,
then the beams scaled to the budget): receivers ``u`` and weights ``w`` from the beams, then
``W = (sum_j w_j |u_j|^2 h_j h_j^H + mu I)^-1 [h_k u_k w_k]_k``. A forward pass is a small MLP
and ``1 + unroll`` batched ``N x N`` solves, trained end to end, and the beams always meet the
power budget. The MLP reads features that carry what the optimum depends on: the structure's rates
depend on the channel only through the Gram matrix ``H H^H`` (the Woodbury identity), and are
unchanged by a phase on any user's row, so the features are the Gram matrix's magnitudes and the
users' gains (log scale).

Training draws fresh Rayleigh channels every step from its own seed (never the test seeds
``0..count-1`` of :func:`corral.problems.mimo.rayleigh`), Adam with a cosine learning rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from corral.problems.mimo import sum_rate

TRAIN_SEED_OFFSET = 1_000_003  # training streams start here: far from the test seeds 0..99


class BeamPolicy(nn.Module):
    """Channels ``H [B, K, N]`` complex -> beams ``W [B, N, K]`` (power exactly ``P``)."""

    def __init__(self, n: int, k: int, P: float, noise: float = 1.0, hidden: int = 256, layers: int = 2,
                 unroll: int = 4):
        super().__init__()
        self.n, self.k, self.P, self.noise, self.unroll = int(n), int(k), float(P), float(noise), int(unroll)
        width = [k * k + k] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in zip(width[:-1], width[1:]):
            mods += [nn.Linear(a, b), nn.LayerNorm(b), nn.SiLU()]
        self.body = nn.Sequential(*mods)
        self.head = nn.Linear(hidden, 2 * k)
        nn.init.zeros_(self.head.weight)  # start at equal lambda and equal p (a regularized ZF)
        nn.init.zeros_(self.head.bias)

    def features(self, H: torch.Tensor) -> torch.Tensor:
        gram = H @ H.mH  # [B, K, K]
        mag = gram.abs() / self.n
        gain = torch.log(torch.diagonal(mag, dim1=-2, dim2=-1) + 1e-6)
        return torch.cat([mag.flatten(1), gain], 1)

    def parameters_of(self, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The structure's ``(lambda, p)`` for each channel, each ``[B, K]`` summing to ``P``."""
        out = self.head(self.body(self.features(H)))
        lam = torch.softmax(out[:, : self.k], -1) * self.P
        p = torch.softmax(out[:, self.k:], -1) * self.P
        return lam, p

    def forward(self, H: torch.Tensor) -> torch.Tensor:
        H = H.to(torch.complex64)
        lam, p = self.parameters_of(H)
        Hh = H.mH  # [B, N, K]
        eye = torch.eye(self.n, dtype=H.dtype, device=H.device)
        T = eye + (Hh * (lam / self.noise).unsqueeze(1).to(H.dtype)) @ H
        D = torch.linalg.solve(T, Hh)
        D = D / torch.linalg.vector_norm(D, dim=1, keepdim=True)
        W = D * p.sqrt().unsqueeze(1).to(D.dtype)
        for _ in range(self.unroll):
            W = self.refine(H, W, eye)
        return W

    def refine(self, H: torch.Tensor, W: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:
        """One WMMSE-style step with the closed-form power multiplier, scaled to the budget."""
        G = H @ W
        g = torch.diagonal(G, dim1=-2, dim2=-1)
        u = g / (G.abs().square().sum(-1) + self.noise)
        w = 1.0 / (1.0 - (u.conj() * g).real).clamp_min(1e-6)
        uw2 = u.abs().square() * w
        Hh = H.mH
        A = (Hh * uw2.unsqueeze(1).to(H.dtype)) @ H + (self.noise * uw2.sum(-1) / self.P)[:, None, None] * eye
        V = torch.linalg.solve(A, Hh * (u * w).unsqueeze(1))
        return V * torch.sqrt(self.P / V.abs().square().sum((-2, -1)))[:, None, None]

    @torch.inference_mode()
    def act(self, H: torch.Tensor) -> torch.Tensor:
        """Beams for channels ``H`` (complex128, scaled to exactly ``P`` in double precision)."""
        W = self(H).to(torch.complex128)
        return W * torch.sqrt(self.P * (1 - 1e-12) / W.abs().square().sum((-2, -1)))[:, None, None]


def train_policy(n: int, k: int, P: float, steps: int = 3000, batch: int = 256, lr: float = 2e-3, seed: int = 0,
                 seconds: float | None = None, noise: float = 1.0, hidden: int = 256, layers: int = 2,
                 unroll: int = 4, progress: Callable[[dict], None] | None = None) -> tuple[BeamPolicy, dict]:
    """Train a :class:`BeamPolicy` for ``steps`` steps (or until ``seconds`` pass) on fresh channels,
    maximizing the batch's mean sum rate; returns ``(policy, info)`` with the steps, seconds and
    the last 100 steps' mean training sum rate."""
    torch.manual_seed(seed)
    policy = BeamPolicy(n, k, P, noise, hidden, layers, unroll)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(TRAIN_SEED_OFFSET + seed)
    t0 = time.perf_counter()
    recent: list[float] = []
    step = 0
    for step in range(1, steps + 1):
        frac = (step - 1) / steps
        if seconds is not None:
            frac = max(frac, (time.perf_counter() - t0) / seconds)
        if frac >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * frac))
        H = torch.complex(torch.randn(batch, k, n, generator=gen), torch.randn(batch, k, n, generator=gen))
        H = H / math.sqrt(2.0)
        rate = sum_rate(H, policy(H), noise)
        loss = -rate.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        recent = (recent + [float(-loss.detach())])[-100:]
        if progress is not None and step % 200 == 0:
            progress({"step": step, "seconds": round(time.perf_counter() - t0, 2),
                      "train_rate": sum(recent) / len(recent)})
    info = {"steps": step, "train_seconds": round(time.perf_counter() - t0, 2), "batch": batch,
            "train_rate": sum(recent) / max(1, len(recent))}
    return policy.eval(), info


def time_per_channel(policy: BeamPolicy, H: torch.Tensor, repeat: int = 5) -> dict:
    """Milliseconds per channel of :meth:`BeamPolicy.act`: the whole batch at once, and one
    channel at a time (the latency a real-time user sees); best of ``repeat``."""
    batched, single = math.inf, math.inf
    policy.act(H[:2])  # warm up
    for _ in range(repeat):
        t = time.perf_counter()
        policy.act(H)
        batched = min(batched, (time.perf_counter() - t) / H.shape[0])
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(min(20, H.shape[0])):
            policy.act(H[i: i + 1])
        single = min(single, (time.perf_counter() - t) / min(20, H.shape[0]))
    return {"ms_batched": batched * 1e3, "ms_single": single * 1e3}
