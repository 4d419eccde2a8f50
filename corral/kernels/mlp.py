"""The fused autograd paths of corral's MLPs: a whole stack of linear layers and activations
as one autograd node with its backward written out (``MLP.fast`` and ``ParallelMLP``'s
training path, and the distributional losses' hand-driven steps), and the fast CPU tanh.

The readable reference of each is the plain module in ``corral.nets`` (``MLP.forward``'s loop of
linear layers, ``ParallelMLP.forward``'s loop with ``members``); ``tests/test_kernels.py`` checks
each against it (``corral.kernels.registry``)."""

from __future__ import annotations

import contextlib

import torch

from corral.kernels.precision import low_dtype, mm
from corral.kernels.registry import BIT_EXACT, register


@register("mlp_fused", reference="corral.nets:MLP.forward", tolerance=BIT_EXACT,
          runs="MLP.fused (2-d input, relu or tanh, gradients flowing): SAC/TD3 actors, the distributional nets")
class _MLPFunction(torch.autograd.Function):
    """``MLP.forward`` for 2-d inputs written out with its backward: one autograd node
    instead of two per layer (a SAC actor's step spends as much in autograd's bookkeeping
    as in its small matmuls). The forward is ``forward``'s ops (the same values bit for
    bit); ``tests/test_nets.py`` checks the gradients against plain autograd."""

    @staticmethod
    def forward(ctx, x, act_name, acts, *params):
        lows: list = []
        h, inputs = mlp_forward(x, params, acts, act_name, lows)
        ctx.act_name, ctx.acts = act_name, acts
        ctx.save_for_backward(*params, *inputs, h, *lows)
        return h

    @staticmethod
    def backward(ctx, grad):
        saved, n = ctx.saved_tensors, len(ctx.acts)
        params, inputs, out, lows = saved[:2 * n], saved[2 * n:3 * n], saved[3 * n], saved[3 * n + 1:]
        grads = [None] * (2 * n)
        need = ctx.needs_input_grad
        g = mlp_backward(grad, params, ctx.acts, ctx.act_name, inputs, out, grads, need[3:], need[0], lows)
        return (g, None, None, *grads)


def _cast(h: torch.Tensor, w: torch.Tensor, lows: list | None):
    """A wide layer's operands in the update's low precision (``(h, w)`` unchanged for a
    float32 layer), appended to ``lows`` for the backward when it is given (None for float32)."""
    low = low_dtype(w)
    if low is not None:
        h, w = h.to(low), w.to(low)
    if lows is not None:
        lows += (h, w) if low is not None else (None, None)
    return h, w, low


def mlp_forward(x: torch.Tensor, params, acts, act_name: str,
                lows: list | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A chain of linear layers on a 2-d input, ``params`` ``(w0, b0, w1, b1, ...)``, the
    activation (relu or tanh, in place) after layer ``i`` where ``acts[i]``. Returns the
    output and each layer's input, what ``mlp_backward`` needs. Wide layers multiply in the
    update's precision (``corral.kernels.precision``); ``lows`` (a list) collects their
    low-precision operands so the backward does not cast them again."""
    act = torch.relu_ if act_name == "relu" else torch.tanh_
    h, inputs = x, []
    for i, after in enumerate(acts):
        inputs.append(h)
        b = params[2 * i + 1]
        hl, wl, low = _cast(h, params[2 * i], lows)
        h = torch.addmm(b, hl, wl.t()) if low is None else torch.mm(hl, wl.t()).float().add_(b)
        if after:
            h = act(h)
    return h, inputs


def mlp_backward(grad: torch.Tensor, params, acts, act_name: str, inputs, out: torch.Tensor, grads: list,
                 needs=None, input_grad: bool = False, lows=None) -> torch.Tensor | None:
    """``mlp_forward``'s backward from ``grad`` (d loss / d out): each layer's weight and bias
    gradient into ``grads[2i]`` / ``grads[2i + 1]`` (where ``needs`` says, all by default);
    an entry that already holds a tensor is written in place (``out=``: a flat optimizer's
    gradient view), else a new tensor is put there. Returns d loss / d input if ``input_grad``."""
    outputs = [*inputs[1:], out]
    g = grad
    for i in reversed(range(len(acts))):
        if acts[i]:
            g = (torch.ops.aten.threshold_backward(g, outputs[i], 0) if act_name == "relu"
                 else torch.ops.aten.tanh_backward(g, outputs[i]))
        low = low_dtype(params[2 * i])  # the forward's precision: both run inside one update
        h, w = (inputs[i], params[2 * i]) if low is None or not lows else lows[2 * i:2 * i + 2]
        gl = g if low is None else g.to(low)
        if needs is None or needs[2 * i]:
            if low is None:
                grads[2 * i] = torch.mm(g.t(), h, out=grads[2 * i])
            elif grads[2 * i] is None:
                grads[2 * i] = mm(gl.t(), h, low)
            else:
                grads[2 * i].copy_(mm(gl.t(), h, low))
        if needs is None or needs[2 * i + 1]:
            grads[2 * i + 1] = torch.sum(g, 0, out=grads[2 * i + 1])
        if i > 0 or input_grad:
            g = g.mm(w) if low is None else mm(gl, w, low)
    return g if input_grad else None


@register("fast_tanh", reference="torch:tanh", tolerance=3e-7,
          runs="ParallelMLP's tanh on CPU tensors of 4096 elements or more")
def fast_tanh_(z: torch.Tensor) -> torch.Tensor:
    """tanh(z) in place; on large CPU tensors as 2*sigmoid(2z) - 1 (within ~2e-7 of
    torch.tanh). torch's CPU tanh kernel is about 3x slower than that whole chain, and it is
    the largest single cost of a small MLP's gradient step; on small tensors (acting on a
    few envs) the chain's four launches cost more than the one tanh."""
    if z.device.type != "cpu" or z.numel() < 4096:
        return z.tanh_()
    return z.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


_FUSED_ACTS = {"tanh": fast_tanh_, "relu": torch.relu_}


@contextlib.contextmanager
def plain_activations():
    """Within it, ``ParallelMLP``'s tanh is ``torch.tanh_`` at every size: a traced or exported
    graph (``corral.export``) has no branch on the batch size (``fast_tanh_``'s), at no cost
    to the training path outside it."""
    saved = _FUSED_ACTS["tanh"]
    _FUSED_ACTS["tanh"] = torch.tanh_
    try:
        yield
    finally:
        _FUSED_ACTS["tanh"] = saved


def _parallel_mlp_forward(x, act_name, act_after, params, lows: list | None = None):
    """Returns the output and the inputs of every layer (what the backward needs); ``lows``
    as ``mlp_forward``'s."""
    act = _FUSED_ACTS[act_name]
    n = params[0].shape[0]
    h = x.unsqueeze(0).expand(n, *x.shape) if x.dim() == 2 else x
    inputs = []
    for i, after in enumerate(act_after):
        inputs.append(h)
        b = params[2 * i + 1]
        hl, wl, low = _cast(h, params[2 * i], lows)
        h = torch.baddbmm(b, hl, wl.mT) if low is None else torch.bmm(hl, wl.mT).float().add_(b)
        if after:
            h = act(h)
    return h, inputs


@register("parallel_mlp", reference="corral.nets:ParallelMLP.forward", tolerance=1e-6,
          runs="ParallelMLP with relu or tanh (actor-critics, twin and ensemble critics): values and gradients "
               "(fast_tanh's rounding on large tanh layers)")
class _ParallelMLPFunction(torch.autograd.Function):
    """ParallelMLP's forward and backward written out for tanh and relu: one autograd
    node for the whole stack instead of two or three per layer (on small nets the
    autograd bookkeeping costs as much as the matmuls), activation derivatives taken
    from the saved outputs. ``tests/test_nets.py`` checks it against plain autograd."""

    @staticmethod
    def forward(ctx, x, act_name, act_after, *params):
        lows: list = []
        out, inputs = _parallel_mlp_forward(x, act_name, act_after, params, lows)
        ctx.act_name, ctx.act_after, ctx.x_dim = act_name, act_after, x.dim()
        ctx.save_for_backward(*params, *inputs, out, *lows)
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        n_layers = len(ctx.act_after)
        params, inputs = saved[:2 * n_layers], saved[2 * n_layers:3 * n_layers]
        out, lows = saved[3 * n_layers], saved[3 * n_layers + 1:]
        outputs = [*inputs[1:], out]  # what each layer's activation produced
        grads = [None] * (2 * n_layers)
        g = grad
        for i in reversed(range(n_layers)):
            if ctx.act_after[i]:
                if ctx.act_name == "tanh":
                    g = torch.ops.aten.tanh_backward(g, outputs[i])
                else:
                    g = torch.ops.aten.threshold_backward(g, outputs[i], 0)
            w, h = params[2 * i], inputs[i]
            low = low_dtype(w)  # the forward's precision: both run inside one update
            gl = g
            if low is not None:  # the forward's low-precision operands, and g cast once
                h, w, gl = lows[2 * i], lows[2 * i + 1], g.to(low)
            # Frozen parameters (a critic under the actor's loss) get no gradient computed.
            if ctx.needs_input_grad[3 + 2 * i]:
                # dW = g^T h, [n, out, in]; computed as (h^T g)^T when out > in: MKL's batched
                # matmul is several times slower when the result's last dimension is tiny.
                grads[2 * i] = mm(gl.mT, h, low) if w.shape[1] <= w.shape[2] else mm(h.mT, gl, low).mT
            if ctx.needs_input_grad[4 + 2 * i]:
                grads[2 * i + 1] = g.sum(1, keepdim=True)
            if i > 0 or ctx.needs_input_grad[0]:
                # one output (a critic's Q): an outer product, exact as a broadcast multiply
                # (no sum over k), ~3x faster than MKL's batched matmul with k = 1
                g = g * w if w.shape[1] == 1 else mm(gl, w, low)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = g.sum(0) if ctx.x_dim == 2 else g
        return (grad_x, None, None, *grads)
