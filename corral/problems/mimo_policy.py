"""A trained policy that maps a channel to beams in one forward pass (RLSolver's pretrained
networks for real-time inference), trained without labels: the loss is the negative sum rate.

The network does not output raw beams. It outputs the two vectors of the optimal beamforming
structure (Bjornson, Bengtsson, Ottersten 2014; the form Xia et al. 2020 learn): with dual
powers ``lambda`` and powers ``p`` (each ``>= 0`` summing to ``P``), every sum-rate optimum is

    w_k = sqrt(p_k) d_k / ||d_k||,   d_k = (I + sum_j lambda_j / sigma^2 h_j h_j^H)^-1 h_k

followed by ``unroll`` refinement layers, each one WMMSE step (deep unfolding, as in Pellaco et
al. 2019) with the power multiplier in closed form instead of a bisection (Christensen et al.
2008: ``mu = sigma^2 sum_k w_k |u_k|^2 / P``): receivers ``u`` and weights ``w`` from the beams,
then ``W' = (sum_j w_j |u_j|^2 h_j h_j^H + e^theta_l mu I)^-1 [h_k u_k w_k]_k``, then the
over-relaxed step ``W + beta_l (W' - W)`` scaled to the budget. ``theta_l`` and ``beta_l`` are
learned per layer; at ``theta_l = 0, beta_l = 1`` a layer is one closed-form WMMSE iteration.

Everything runs in the users' space: by the push-through identity
``(H^H A H + mu I)^-1 H^H = H^H (A H H^H + mu I)^-1``, every beam set above is ``W = H^H X`` with
``X [K, K]``, and the layers see the channel only through the Gram matrix ``Gm = H H^H``:
``G = H W = Gm X``, ``||W||^2 = tr(X^H Gm X)``, the structure's ``X = (Gm + sigma^2 /
lambda)^-1`` (columns then normalized) and a layer's ``X' = (Gm + e^theta mu / a)^-1 diag(T g /
|g|^2)`` with ``a_k = w_k |u_k|^2``, ``T_k = sum_j |G_kj|^2 + sigma^2``, ``g_k = G_kk``: one
``K x K`` solve per layer. The MLP reads the Gram matrix in a fixed phase gauge (each user's row
turned so that row 0 is real: the rates do not change with a phase on any user's row, and
neither does this input) and the users' log gains. Magnitudes alone would drop the relative
phases between users, which decide how far their beams can be separated (at 8 users and 20 dB
the policy gained 1.5 points of WMMSE's rate from them).

Training draws fresh Rayleigh channels every step from its own seed (never the test seeds
``0..count-1`` of :func:`corral.problems.mimo.rayleigh`), Adam with a cosine learning rate and
the gradient's norm clipped.
:meth:`BeamPolicy.act` on one channel runs a path written for one channel (numpy and LAPACK's
Cholesky, the weights exported once): at batch 1 the cost is per-operation overhead, which is
several times lower there than in torch's dispatch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from corral.problems.mimo import sum_rate

TRAIN_SEED_OFFSET = 1_000_003  # training streams start here: far from the test seeds 0..99


def _diag(v: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(v)


class BeamPolicy(nn.Module):
    """Channels ``H [B, K, N]`` complex -> beams ``W [B, N, K]`` (power exactly ``P``)."""

    def __init__(self, n: int, k: int, P: float, noise: float = 1.0, hidden: int = 256, layers: int = 2,
                 unroll: int = 6):
        super().__init__()
        self.n, self.k, self.P, self.noise, self.unroll = int(n), int(k), float(P), float(noise), int(unroll)
        width = [2 * k * k + k] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in zip(width[:-1], width[1:]):
            mods += [nn.Linear(a, b), nn.LayerNorm(b), nn.SiLU()]
        self.body = nn.Sequential(*mods)
        self.head = nn.Linear(hidden, 2 * k)
        nn.init.zeros_(self.head.weight)  # start at equal lambda and equal p (a regularized ZF)
        nn.init.zeros_(self.head.bias)
        self.theta = nn.Parameter(torch.zeros(self.unroll))  # log scale of each layer's mu
        self.beta = nn.Parameter(torch.ones(self.unroll))  # each layer's relaxation
        self._fast: dict | None = None

    def features(self, gram: torch.Tensor) -> torch.Tensor:
        """The Gram matrix in a fixed phase gauge (user ``j``'s row turned by ``e^{i arg Gm_0j}``,
        so row 0 is real and a phase on any user's channel leaves every entry unchanged), its real
        and imaginary parts, and the users' log gains."""
        g = gram[:, 0, :]
        ph = g / g.abs().clamp_min(1e-12)
        gauged = gram * ph.unsqueeze(-1) * ph.conj().unsqueeze(-2) / self.n
        gain = torch.log(torch.diagonal(gram.real, dim1=-2, dim2=-1) / self.n + 1e-6)
        return torch.cat([gauged.real.flatten(1), gauged.imag.flatten(1), gain], 1).to(self.head.weight.dtype)

    def parameters_of(self, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The structure's ``(lambda, p)`` for each channel, each ``[B, K]`` summing to ``P``."""
        out = self.head(self.body(self.features(gram)))
        return torch.softmax(out[:, : self.k], -1) * self.P, torch.softmax(out[:, self.k:], -1) * self.P

    def structure(self, gram: torch.Tensor) -> torch.Tensor:
        """``X [B, K, K]`` of the structure's beams ``H^H X`` at the MLP's ``(lambda, p)``."""
        lam, p = self.parameters_of(gram)
        eye = torch.eye(self.k, dtype=gram.dtype, device=gram.device).expand_as(gram)  # a matrix, never a batch of vectors
        X = torch.linalg.solve(gram + _diag((self.noise / lam).to(gram.dtype)), eye)
        norm2 = (X.conj() * (gram @ X)).real.sum(-2)  # ||d_k||^2 = (X^H Gm X)_kk
        return X * torch.sqrt(p / norm2).unsqueeze(-2).to(X.dtype)

    def layer(self, gram: torch.Tensor, X: torch.Tensor, theta, beta) -> torch.Tensor:
        """One unrolled layer on ``X [B, K, K]`` (beams ``H^H X``); see the module docstring."""
        G = gram @ X
        M = torch.view_as_real(G).square().sum(-1)  # |h_k^H w_j|^2
        T = M.sum(-1) + self.noise
        S = torch.diagonal(M, dim1=-2, dim2=-1).clamp_min(1e-12)  # a user with no signal: no inf
        a = S / (T * (T - S))  # w_k |u_k|^2
        mu = (self.noise / self.P) * a.sum(-1, keepdim=True) * torch.exp(theta)
        rhs = _diag(torch.diagonal(G, dim1=-2, dim2=-1) * (T / S))
        X = X + beta * (torch.linalg.solve(gram + _diag((mu / a).to(gram.dtype)), rhs) - X)
        return self.scaled(gram, X)

    def scaled(self, gram: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """``X`` scaled so that the beams ``H^H X`` have total power ``P``."""
        pw = (X.conj() * (gram @ X)).real.sum((-2, -1), keepdim=True)
        return X * torch.sqrt(self.P / pw)

    def forward(self, H: torch.Tensor) -> torch.Tensor:
        H = H.to(torch.complex64)
        gram = H @ H.mH
        X = self.structure(gram)
        for i in range(self.unroll):
            X = self.layer(gram, X, self.theta[i].clamp(-3.0, 3.0), self.beta[i])
        return H.mH @ X

    def train(self, mode: bool = True):
        self._fast = None  # the one-channel path's exported weights are stale once training resumes
        return super().train(mode)

    @torch.inference_mode()
    def act(self, H: torch.Tensor) -> torch.Tensor:
        """Beams for channels ``H`` (complex128, scaled to exactly ``P`` in double precision); one
        channel goes through :meth:`act_one`."""
        if H.shape[0] == 1:
            return torch.from_numpy(self.act_one(H[0].numpy()))[None]
        W = self(H).to(torch.complex128)
        return W * torch.sqrt(self.P * (1 - 1e-12) / W.abs().square().sum((-2, -1)))[:, None, None]

    def act_one(self, H: np.ndarray) -> np.ndarray:
        """Beams ``[N, K]`` (complex128) for one channel ``H [K, N]``: the same computation as
        :meth:`forward`, written for one channel in numpy, double precision."""
        from corral.problems.mimo_fast import act_one, export

        if self._fast is None:
            self._fast = export(self)
        return act_one(self._fast, H)


def train_policy(n: int, k: int, P: float, steps: int = 3000, batch: int = 256, lr: float = 1e-3, seed: int = 0,
                 seconds: float | None = None, noise: float = 1.0, hidden: int = 256, layers: int = 2,
                 unroll: int = 6, clip: float | None = 1.0,
                 progress: Callable[[dict], None] | None = None) -> tuple[BeamPolicy, dict]:
    """Train a :class:`BeamPolicy` for ``steps`` steps (or until ``seconds`` of this process's CPU
    time pass: with one torch thread that is the training's own time, whatever else loads the
    machine) on fresh channels, maximizing the batch's mean sum rate, each gradient clipped to
    norm ``clip`` (without it, the 16-user 20 dB training climbed for 200 steps and then slid back
    from 69.0 to 67.5 bits); returns ``(policy, info)``
    with the steps, CPU and wall seconds, the last 100 steps' mean training sum rate and the
    number of steps skipped for a non-finite loss."""
    torch.manual_seed(seed)
    policy = BeamPolicy(n, k, P, noise, hidden, layers, unroll)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(TRAIN_SEED_OFFSET + seed)
    t0, c0 = time.perf_counter(), time.process_time()
    recent: list[float] = []
    step = skipped = 0
    for step in range(1, steps + 1):
        frac = (step - 1) / steps
        if seconds is not None:
            frac = max(frac, (time.process_time() - c0) / seconds)
        if frac >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * frac))
        H = torch.complex(torch.randn(batch, k, n, generator=gen), torch.randn(batch, k, n, generator=gen))
        H = H / math.sqrt(2.0)
        loss = -sum_rate(H, policy(H), noise).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), clip if clip else math.inf)
        if not bool(torch.isfinite(norm)):
            skipped += 1  # an ill-conditioned batch in float32: skip it rather than poison Adam
            continue
        opt.step()
        recent = (recent + [float(-loss.detach())])[-100:]
        if progress is not None and step % 200 == 0:
            progress({"step": step, "cpu_seconds": round(time.process_time() - c0, 2),
                      "train_rate": sum(recent) / len(recent)})
    info = {"steps": step, "train_seconds": round(time.process_time() - c0, 2),
            "train_wall_seconds": round(time.perf_counter() - t0, 2), "batch": batch,
            "train_rate": sum(recent) / max(1, len(recent)), "skipped": skipped}
    return policy.eval(), info


def time_per_channel(policy: BeamPolicy, H: torch.Tensor, repeat: int = 5) -> dict:
    """Milliseconds per channel of :meth:`BeamPolicy.act`: the whole batch at once (best of
    ``repeat``), and one channel at a time (the latency a real-time user sees: each of the first
    20 channels' best of ``repeat`` calls, averaged over them)."""
    batched = math.inf
    policy.act(H[:2])  # warm up
    policy.act(H[:1])
    for _ in range(repeat):
        t = time.perf_counter()
        policy.act(H)
        batched = min(batched, (time.perf_counter() - t) / H.shape[0])
    single = []
    for i in range(min(20, H.shape[0])):
        best = math.inf
        for _ in range(repeat):
            t = time.perf_counter()
            policy.act(H[i: i + 1])
            best = min(best, time.perf_counter() - t)
        single.append(best)
    return {"ms_batched": batched * 1e3, "ms_single": sum(single) / len(single) * 1e3}
