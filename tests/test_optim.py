import copy

import pytest
import torch
from torch import nn

import corral.optim
from corral.nets import MLP, ParallelMLP
from corral.optim import FlatAdam, FlatRMSprop


def make_pair(max_norm):
    torch.manual_seed(0)
    net = torch.nn.Sequential(ParallelMLP(2, 4, (16, 16), "tanh", out_dim=3), torch.nn.Flatten(0))
    ref = copy.deepcopy(net)
    return net, FlatAdam(net.parameters(), lr=3e-3, eps=1e-5, max_grad_norm=max_norm), ref, \
        torch.optim.Adam(ref.parameters(), lr=3e-3, eps=1e-5, foreach=False)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "op-by-op"])
def test_flat_adam_matches_torch_adam_with_gradient_clipping_step_by_step(fused, monkeypatch):
    if fused and not corral.optim._FUSED:
        pytest.skip("this torch has no fused Adam kernel")
    monkeypatch.setattr(corral.optim, "_FUSED", fused)
    net, opt, ref, ref_opt = make_pair(max_norm=0.5)
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        x = torch.randn(32, 4, generator=g)
        for model, o in ((net, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x).square().mean().backward()
            if o is ref_opt:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            o.step()
        for a, b in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_gradients_land_in_the_flat_buffer_and_parameters_view_it():
    torch.manual_seed(0)
    net = MLP(3, (8,), "relu", out_dim=2)
    opt = FlatAdam(net.parameters(), lr=1e-2)
    net(torch.randn(5, 3)).sum().backward()
    assert opt.grad.abs().sum() > 0
    # every parameter's .grad is its slice of the flat buffer (was: two sums compared exactly,
    # which depended on summation order and on the unseeded draw)
    assert torch.equal(torch.cat([p.grad.flatten() for p in net.parameters()]), opt.grad)
    before = opt.flat.clone()
    opt.step()
    assert not torch.equal(before, opt.flat)
    assert torch.equal(torch.cat([p.detach().flatten() for p in net.parameters()]), opt.flat)


def test_state_dict_round_trip_continues_identically():
    net, opt, _, _ = make_pair(max_norm=None)
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad(); net(x).square().mean().backward(); opt.step()  # noqa: E702
    net2, opt2, _, _ = make_pair(max_norm=None)
    net2.load_state_dict(net.state_dict())
    opt2.load_state_dict(opt.state_dict())
    for model, o in ((net, opt), (net2, opt2)):
        o.zero_grad(); model(x).square().mean().backward(); o.step()  # noqa: E702
    assert torch.equal(opt.flat, opt2.flat)


def test_schedules_can_set_the_learning_rate_through_param_groups():
    net = MLP(3, (4,), "relu", out_dim=1)
    opt = FlatAdam(net.parameters(), lr=1e-2)
    for group in opt.param_groups:
        group["lr"] = 5e-4
    assert opt.lr == 5e-4


@pytest.mark.parametrize("cls", [FlatAdam, FlatRMSprop])
def test_a_deep_copied_module_and_optimizer_learn_as_the_original_would(cls):
    """deepcopy of an algorithm (its networks and flat optimizer together) gives a copy whose
    steps move its own parameters, as the original's would, and leave the original alone."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    holder = {"net": net, "opt": cls(net.parameters(), lr=0.05)}
    twin = copy.deepcopy(holder)
    x = torch.randn(16, 3)
    start = [p.detach().clone() for p in net.parameters()]
    for h in (twin, holder):
        for _ in range(3):
            h["opt"].zero_grad()
            h["net"](x).square().mean().backward()
            h["opt"].step()
    moved = [p.detach() for p in twin["net"].parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(moved, start))  # the copy learned
    assert all(torch.equal(a, b) for a, b in zip(moved, net.parameters()))  # as the original did
    p = next(twin["net"].parameters())
    assert p.data_ptr() == twin["opt"].flat.data_ptr() and p.data_ptr() != holder["opt"].flat.data_ptr()


def test_adam_steps_with_subnormal_moments_flush_them_and_leave_the_threads_float_mode_as_it_was():
    """Subnormal second moments (squared gradients of a unit that barely learns) are flushed to
    zero inside the step, which keeps the CPU off its slow subnormal path; the parameters move
    as torch.optim.Adam moves them, and the thread's flush-to-zero mode is restored."""
    from corral.optim import denormals_flushed

    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    ref = copy.deepcopy(net)
    opt = FlatAdam(net.parameters(), lr=1e-3, eps=1e-8)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3, eps=1e-8, foreach=False)
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        grads = torch.randn(opt.grad.shape, generator=g)
        grads[: grads.numel() // 2] *= 1e-20  # squares (~1e-40, times 1 - beta2) subnormal
        opt.grad.copy_(grads)
        for p, ref_p in zip(net.parameters(), ref.parameters()):
            ref_p.grad = p.grad.clone()
        assert not denormals_flushed()
        opt.step()
        ref_opt.step()
        assert not denormals_flushed()  # restored after the step
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    half = opt.exp_avg_sq[: opt.grad.numel() // 2]
    assert torch.equal(half, torch.zeros_like(half))  # flushed, not kept as subnormals
    ref_sq = torch.cat([ref_opt.state[p]["exp_avg_sq"].flatten() for p in ref.parameters()])
    assert (ref_sq[: opt.grad.numel() // 2] > 0).any()  # torch's own Adam keeps them

    torch.set_flush_denormal(True)  # a process that flushes already: the step leaves it so
    try:
        opt.step()
        assert denormals_flushed()
    finally:
        torch.set_flush_denormal(False)
