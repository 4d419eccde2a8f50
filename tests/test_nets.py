"""ParallelMLP's hand-written forward/backward against plain autograd with torch's own ops."""

import pytest
import torch
from torch import nn

from corral.nets import ParallelMLP, _parallel_mlp_forward, fast_tanh_


def reference(net: ParallelMLP, x: torch.Tensor) -> torch.Tensor:
    act = {"tanh": torch.tanh, "relu": torch.relu}[net.act_name]
    h = x.unsqueeze(0).expand(net.n, *x.shape) if x.dim() == 2 else x
    for (w, b), after in zip(net._layers, net._act_after):
        h = torch.baddbmm(b, h, w.mT)
        if after:
            h = act(h)
    return h


def test_fast_tanh_matches_torch_tanh():
    z = torch.linspace(-30, 30, 100_001)  # large: the sigmoid form
    assert torch.allclose(fast_tanh_(z.clone()), torch.tanh(z), atol=3e-7, rtol=0)


@pytest.mark.parametrize("act", ["tanh", "relu"])
@pytest.mark.parametrize("out_dim", [3, 1, None])
@pytest.mark.parametrize("shared_input", [True, False])
def test_parallel_mlp_gradients_match_autograd(act, out_dim, shared_input):
    torch.manual_seed(0)
    net = ParallelMLP(2, 5, (16, 8), act, out_dim=out_dim).double()
    with torch.no_grad():  # non-zero biases so every bias gradient path is exercised
        for b in net.biases:
            b.normal_()
    x = torch.randn(32, 5, dtype=torch.double) if shared_input else torch.randn(2, 32, 5, dtype=torch.double)
    x.requires_grad_(True)
    upstream = torch.randn(2, 32, out_dim or 8, dtype=torch.double)

    out = net(x)
    grads = torch.autograd.grad((out * upstream).sum(), [x, *net.parameters()])
    ref_out = reference(net, x)
    ref_grads = torch.autograd.grad((ref_out * upstream).sum(), [x, *net.parameters()])

    assert torch.allclose(out, ref_out, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape
        assert torch.allclose(g, r, atol=1e-6), (g - r).abs().max()


def test_one_output_backward_is_the_batched_matmul_bit_for_bit():
    """A critic's last layer (one output) back-propagates as a broadcast product, the values
    ``torch.bmm`` gives exactly (k = 1: one product per entry, nothing summed)."""
    torch.manual_seed(3)
    net = ParallelMLP(2, 4, (256, 256), "relu", out_dim=1)
    x = torch.randn(256, 4, requires_grad=True)
    upstream = torch.randn(2, 256, 1)
    grads = torch.autograd.grad((net(x) * upstream).sum(), [x, *net.parameters()])
    # the same backward with the batched matmul at the last layer
    params = [t for wb in net._layers for t in wb]
    _, inputs = _parallel_mlp_forward(x.detach(), "relu", net._act_after, params)
    outputs = [*inputs[1:]]
    g = torch.bmm(upstream, params[4])
    ref = [None] * 6
    ref[4], ref[5] = torch.bmm(upstream.mT, inputs[2]), upstream.sum(1, keepdim=True)
    for i in (1, 0):
        g = torch.ops.aten.threshold_backward(g, outputs[i], 0)
        w = params[2 * i]
        ref[2 * i] = torch.bmm(g.mT, inputs[i]) if w.shape[1] <= w.shape[2] else torch.bmm(inputs[i].mT, g).mT
        ref[2 * i + 1] = g.sum(1, keepdim=True)
        g = torch.bmm(g, w)
    want = [g.sum(0), *ref[0::2], *ref[1::2]]  # parameters(): the weights, then the biases
    assert len(grads) == len(want) == 7
    for got, w in zip(grads, want):
        assert torch.equal(got, w)


def test_parallel_mlp_no_grad_path_equals_grad_path():
    torch.manual_seed(1)
    net = ParallelMLP(2, 4, (8,), "tanh", out_dim=2)
    x = torch.randn(10, 4)
    with torch.no_grad():
        a = net(x)
    b = net(x)
    assert b.requires_grad and torch.equal(a, b.detach())


def test_parallel_mlp_other_activations_use_autograd():
    net = ParallelMLP(3, 4, (8,), "silu", out_dim=1)
    x = torch.randn(6, 4, requires_grad=True)
    net(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_frozen_parameters_get_no_gradient_but_the_input_does():
    torch.manual_seed(2)
    net = ParallelMLP(2, 3, (8, 8), "relu", out_dim=1)
    for p in net.parameters():
        p.requires_grad_(False)
    x = torch.randn(5, 3, requires_grad=True)
    net(x).sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    reference(net, ref_x).sum().backward()
    assert all(p.grad is None for p in net.parameters())
    assert torch.allclose(x.grad, ref_x.grad, atol=1e-6)


def test_mlp_forward_is_its_layers_in_order_and_survives_deepcopy():
    import copy

    from corral.nets import MLP

    torch.manual_seed(3)
    net = MLP(4, (8, 8), "relu", out_dim=2)
    x = torch.randn(5, 4)
    assert torch.equal(net(x), torch.nn.Sequential.forward(net, x))
    twin = copy.deepcopy(net)
    with torch.no_grad():
        twin[0].weight.add_(1.0)  # the copy's forward must use the copy's parameters
    assert torch.equal(twin(x), torch.nn.Sequential.forward(twin, x))
    assert not torch.equal(twin(x), net(x))


@pytest.mark.parametrize("act", ["tanh", "relu"])
@pytest.mark.parametrize("out_dim", [3, None])
def test_mlp_fused_gives_forwards_values_and_autograds_gradients(act, out_dim):
    from corral.nets import MLP

    torch.manual_seed(4)
    net = MLP(5, (16, 8), act, out_dim=out_dim).double()
    x = torch.randn(32, 5, dtype=torch.double, requires_grad=True)
    upstream = torch.randn(32, out_dim or 8, dtype=torch.double)
    out, ref = net.fused(x), net(x)
    assert out.grad_fn is not None and type(out.grad_fn).__name__ == "_MLPFunctionBackward"
    assert torch.equal(out, ref)  # the same ops forward: bit for bit
    grads = torch.autograd.grad((out * upstream).sum(), [x, *net.parameters()])
    ref_grads = torch.autograd.grad((ref * upstream).sum(), [x, *net.parameters()])
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape and torch.allclose(g, r, atol=1e-10), (g - r).abs().max()
    # frozen weights: only the input's gradient is formed; no gradients at all: plain forward
    for p in net.parameters():
        p.requires_grad_(False)
    (gx,) = torch.autograd.grad((net.fused(x) * upstream).sum(), [x])
    assert torch.allclose(gx, ref_grads[0], atol=1e-10)
    assert net.fused(x.detach()).grad_fn is None


def test_parallel_mlp_torch_init_is_nn_linears_and_orthogonal_is_the_default():
    """``init="torch"`` (SB3's ortho_init=False) draws each member as ``nn.Linear`` would, in the same
    order: under one seed, a one-member net equals two ``nn.Linear`` layers built under it."""
    torch.manual_seed(0)
    net = ParallelMLP(1, 4, (8,), "tanh", out_dim=3, init="torch")
    torch.manual_seed(0)
    ref = [nn.Linear(4, 8), nn.Linear(8, 3)]
    for (w, b), lin in zip(net._layers, ref):
        assert torch.equal(w[0], lin.weight) and torch.equal(b[0, 0], lin.bias)
    ortho = ParallelMLP(2, 6, (6,), "tanh", out_dim=6, out_gains=(0.01, 1.0))
    w = ortho._layers[0][0][0]
    torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(6))  # gain sqrt(2), square: exactly orthogonal
    assert torch.count_nonzero(ortho._layers[0][1]) == 0
    with pytest.raises(ValueError, match="init must be one of"):
        ParallelMLP(1, 4, (8,), init="xavier")
