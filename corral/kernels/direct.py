"""The value family's gradient step without autograd, where the Q-network is one chain of
linear layers (``QNetwork.chain`` / ``ZNetwork.chain``) and one ``FlatAdam`` holds exactly its
parameters: the same forward as the readable step (``DQN.phases``, ``QRDQN.phases``), the
loss's gradient formed from ATen's own backward kernel or with its values, the chain's backward
written out (``mlp_backward``) straight into the optimizer's flat gradient, every entry of it, so
no graph, engine or ``zero_grad``. The same numbers as autograd's step, bit for bit
(``tests/test_kernels.py``), with ~25% less CPU a step at the CartPole presets.

The steps call the algorithm's own target and bookkeeping methods (``td_target``,
``td_targets``, ``chosen_index``, ``finish``), so a variant that changes those (M-DQN's target)
keeps the kernel; one that overrides ``phases`` gets its own step (``Replaces``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corral.kernels.mlp import mlp_backward, mlp_forward
from corral.kernels.quantile import QuantileHuber
from corral.kernels.registry import BIT_EXACT, register
from corral.optim import FlatAdam


def direct_chain(net, optimizer):
    """``net.chain()`` (``(params, acts, activation)``) where one FlatAdam holds exactly those
    parameters, in that order; else None."""
    if not isinstance(optimizer, FlatAdam):
        return None
    chain = net.chain()
    if chain is not None and [id(p) for p in chain[0]] != [id(p) for p in optimizer.params]:
        return None
    return chain


@register("dqn_direct_step", reference="corral.algos.dqn:DQN.phases", tolerance=BIT_EXACT,
          runs="DQN and M-DQN: a plain MLP Q-network, the Huber loss, no double or noisy nets, FlatAdam")
def huber_direct_step(algo, batch, shared, params, acts, act_name):
    """``DQN.phases``' gradient step: the Huber loss's gradient from ATen's backward kernel on
    what autograd would feed it (the mean's 1 / B, times the PER weights)."""
    net, cfg, B = algo.actor, algo.cfg, batch.obs.shape[0]
    with torch.no_grad():
        out, inputs = mlp_forward(batch.obs if net.enc.identity else net.enc(batch.obs), params, acts, act_name)
        target = algo.td_target(batch, shared, None)
        index = batch.action.long().unsqueeze(-1)
        q = out.gather(-1, index).squeeze(-1)
        per_sample = F.smooth_l1_loss(q, target, reduction="none")
        loss = (per_sample * batch.weights).mean() if cfg.prioritized else per_sample.mean()
        grad = torch.ones_like(q).div_(B)
        if cfg.prioritized:
            grad = grad * batch.weights
        grad = torch.ops.aten.smooth_l1_loss_backward(grad, q, target, 0, 1.0)  # reduction none, beta 1
        g_out = out.new_zeros(out.shape).scatter_(-1, index, grad.unsqueeze(-1))
        mlp_backward(g_out, params, acts, act_name, inputs, out, list(algo.optimizer.grad_views))
        algo.optimizer.step()
    return {"q_loss": loss, "q_mean": q.mean()}, ((q - target).abs() if cfg.prioritized else None)


@register("qrdqn_direct_step", reference="corral.algos.distributional:QRDQN.phases", tolerance=BIT_EXACT,
          runs="QR-DQN: a plain MLP net (no dueling, noisy layers or CNN), kappa > 0, no double, FlatAdam")
def quantile_direct_step(algo, batch, shared, params, acts, act_name):
    """``QRDQN.phases``' gradient step: the quantile Huber loss's gradient formed with its values
    (``QuantileHuber.values_and_grad``)."""
    net, cfg, B = algo.actor, algo.cfg, batch.obs.shape[0]
    with torch.no_grad():
        out, inputs = mlp_forward(batch.obs if net.enc.identity else net.enc(batch.obs), params, acts, act_name)
        target = algo.td_targets(batch, shared, None)
        index = algo.chosen_index(batch)
        chosen = out.view(B, net.n, net.k).gather(1, index).squeeze(1)
        per_sample, grad = QuantileHuber.values_and_grad(chosen, target, algo.taus, cfg.kappa)
        loss, stats, td = algo.finish(per_sample, batch, chosen)
        # d loss / d per_sample: the batch mean's 1 / B (times the PER weights), as autograd forms it
        grad = grad * ((batch.weights * (1.0 / B)).unsqueeze(-1) if cfg.prioritized else 1.0 / B)
        g_out = out.new_zeros(B, net.n, net.k).scatter_add_(1, index, grad.unsqueeze(1))
        mlp_backward(g_out.view(B, -1), params, acts, act_name, inputs, out, list(algo.optimizer.grad_views))
        algo.optimizer.step()
    return stats, td
