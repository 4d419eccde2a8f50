"""The quantile Huber loss with its gradient formed in the forward, in cache-sized chunks
(QR-DQN, IQN and TQC at ``kappa > 0``). The reference is ``quantile_huber_loss`` in
``corral/algos/distributional.py``, the paper's formula under autograd."""

from __future__ import annotations

import torch

from corral.kernels.compiled import compiled, compiling
from corral.kernels.registry import register


@register("quantile_huber", reference="corral.algos.distributional:quantile_huber_loss", tolerance=1e-6,
          runs="QR-DQN, IQN and TQC with kappa > 0 (values and gradients; another order of the same sums)")
class QuantileHuber(torch.autograd.Function):
    """``quantile_huber_loss`` (kappa > 0) with its gradient: the same values, computed in
    chunks of rows with the gradient formed in the forward, ``d/d theta_i = -mean_j
    |tau_i - 1{u_ij < 0}| clip(u_ij, -kappa, kappa) / kappa``. TQC's pairwise tensor is
    ``[B, N*M, kept]`` (256 x 50 x 46 at the defaults): autograd over it costs ~14 ms a
    step on one core; chunks that stay in cache (~37k pairs: 16 of TQC's rows, all 64 of
    QR-DQN's) and no saved pairwise tensors ~2.6 ms. ``taus``: ``[N]`` or ``[B, N]`` (IQN)."""

    @staticmethod
    def forward(ctx, pred, target, taus, kappa):
        loss, grad = QuantileHuber.values_and_grad(pred, target, taus, kappa)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def values_and_grad(pred, target, taus, kappa):
        """The per-sample losses ``[B]`` and their gradients w.r.t. ``pred`` ``[B, N]``;
        fused by torch.compile inside an update of a ``compile: true`` run."""
        if compiling():
            return compiled(quantile_huber_fused)(pred, target, taus, float(kappa))
        B = pred.shape[0]
        # Cache-sized chunks on CPU; one chunk on a GPU, where each chunk is ~10 more kernel
        # launches and launches, not memory, are what a step of this size costs there.
        rows = B if pred.is_cuda else max(16, 36_864 // max(1, pred.shape[-1] * target.shape[-1]))
        if rows >= B:
            return QuantileHuber._chunk(pred, target, taus, kappa)
        parts = [QuantileHuber._chunk(pred[s:s + rows], target[s:s + rows], taus if taus.dim() == 1 else taus[s:s + rows],
                                      kappa) for s in range(0, B, rows)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    @staticmethod
    def _chunk(pred, target, taus, kappa):
        col = taus.unsqueeze(-1)
        u = target.unsqueeze(-2) - pred.unsqueeze(-1)  # u_ij = T_j - theta_i
        w = torch.where(u < 0, 1.0 - col, col)  # |tau_i - 1{u_ij < 0}|
        c = u.clamp(-kappa, kappa)
        # The Huber loss at kappa is c (u - c / 2), c = clamp(u) (u^2 / 2 inside, kappa (|u| -
        # kappa / 2) out), so w c serves both: summed, the gradient; times (u - c / 2), the loss.
        # Nine passes over the pairs, the 1 / (N' kappa) on the [B, N] sums.
        wc = w.mul_(c)
        scale = 1.0 / (u.shape[-1] * kappa)
        loss = u.sub_(c, alpha=0.5).mul_(wc).sum((-1, -2)).mul_(scale)
        return loss, wc.sum(-1).mul_(-scale)

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return g.unsqueeze(-1) * grad, None, None, None


@register("quantile_huber_fused", reference="corral.algos.distributional:quantile_huber_loss", tolerance=1e-6,
          runs="QuantileHuber's values and gradient under compile: true (torch.compile fuses the pairs into one loop)")
def quantile_huber_fused(pred, target, taus, kappa: float):
    """``QuantileHuber.values_and_grad`` written over all the pairs at once, for torch.compile:
    compiled, no pairwise tensor is ever stored (eager, it would be ~9 of them)."""
    col = taus.unsqueeze(-1)
    u = target.unsqueeze(-2) - pred.unsqueeze(-1)  # u_ij = T_j - theta_i
    c = u.clamp(-kappa, kappa)
    wc = torch.where(u < 0, 1.0 - col, col) * c
    scale = 1.0 / (u.shape[-1] * kappa)
    loss = ((u - 0.5 * c) * wc).sum((-1, -2)) * scale
    return loss, wc.sum(-1) * -scale
