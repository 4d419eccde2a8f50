"""The updates' bfloat16 matmuls (corral/kernels/precision.py): wide layers only, float32
outside an update, values and gradients near float32's, refused where the CPU lacks it."""

import pytest
import torch

from corral.errors import UserError
from corral.kernels import precision
from corral.kernels.precision import check_matmul, update_matmul
from corral.nets import MLP, ParallelMLP


def _grads(net, x, fn):
    x = x.clone().requires_grad_(True)
    out = fn(net, x)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * upstream).sum(), [x, *net.parameters()])
    return out.detach(), grads


PATHS = {
    "mlp plain": (lambda: MLP(5, (128, 128), "tanh", out_dim=3), lambda n, x: n(x)),
    "mlp fused": (lambda: MLP(5, (128, 128), "tanh", out_dim=3), lambda n, x: n.fused(x)),
    "parallel fused": (lambda: ParallelMLP(2, 5, (128, 128), "tanh", out_dim=1), lambda n, x: n(x)),
    "parallel plain (silu)": (lambda: ParallelMLP(2, 5, (128, 128), "silu", out_dim=1), lambda n, x: n(x)),
    "parallel members": (lambda: ParallelMLP(3, 5, (128, 128), "tanh", out_dim=1),
                         lambda n, x: n(x, torch.tensor([0, 2]))),
    # CrossQ's batch-renormed critics (training mode: the batch's statistics) and DroQ's
    "renorm critics": (lambda: _renorm_critics(), lambda n, x: n(x[:, :3], x[:, 3:], train=True)),
    "dropout critics": (lambda: _dropout_critics(), lambda n, x: n(x[:, :3], x[:, 3:])),
}


def _renorm_critics():
    from corral.actors.normed import RenormCritics

    return RenormCritics(3, 2, n=2, hidden=(128, 128), activation="tanh")


def _dropout_critics():
    from corral.actors.normed import DropoutCritics

    return DropoutCritics(3, 2, n=2, hidden=(128, 128), activation="tanh")


@pytest.mark.parametrize("path", PATHS)
def test_bfloat16_update_is_near_float32_and_not_equal(path):
    make, fn = PATHS[path]
    torch.manual_seed(0)
    net = make()
    x = torch.randn(64, 5)
    out32, grads32 = _grads(net, x, fn)
    with update_matmul("bfloat16"):
        out16, grads16 = _grads(net, x, fn)
    assert not torch.equal(out32, out16)  # the wide layer did multiply in bfloat16
    assert (out16 - out32).norm() <= 1e-2 * out32.norm()
    # batch renorm divides by the batch's std, which carries the bfloat16 rounding into every row
    tol = 3e-2 if path == "renorm critics" else 1e-2
    for g32, g16 in zip(grads32, grads16):  # smooth activations: a relu near 0 may flip, and its unit with it
        assert g16.dtype == torch.float32
        assert (g16 - g32).norm() <= tol * g32.norm() + 1e-6


@pytest.mark.parametrize("path", PATHS)
def test_float32_update_and_narrow_nets_are_bit_for_bit_unchanged(path):
    make, fn = PATHS[path]
    torch.manual_seed(0)
    net = make()
    x = torch.randn(64, 5)
    ref_out, ref_grads = _grads(net, x, fn)
    with update_matmul("float32"):
        out, grads = _grads(net, x, fn)
    assert torch.equal(out, ref_out) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    narrow = MLP(5, (precision.WIDE - 1, precision.WIDE - 1), "relu", out_dim=3)
    ref = narrow(x)
    with update_matmul("bfloat16"):
        assert torch.equal(narrow(x), ref)  # no layer wide enough on both sides: float32 throughout


def test_the_context_restores_float32_even_on_error():
    with pytest.raises(RuntimeError):
        with update_matmul("bfloat16"):
            assert precision.low_dtype(torch.empty(256, 256)) is torch.bfloat16
            raise RuntimeError
    assert precision.low_dtype(torch.empty(256, 256)) is None


def test_check_matmul_refuses_unknown_names_and_cpus_without_bfloat16(monkeypatch):
    with pytest.raises(UserError, match="choose one of float32, bfloat16"):
        check_matmul("fp8", torch.device("cpu"))
    monkeypatch.setattr(precision, "native_bfloat16_cpu", lambda: False)
    with pytest.raises(UserError, match="no bfloat16 dot-product instructions"):
        check_matmul("bfloat16", torch.device("cpu"))
    check_matmul("float32", torch.device("cpu"))  # always allowed


def test_cli_refuses_bfloat16_on_a_cpu_without_it(monkeypatch, tmp_path, capsys):
    from corral.cli import main

    monkeypatch.setattr(precision, "native_bfloat16_cpu", lambda: False)
    code = main(["train", "sac", "Pendulum-v1", "--steps", "300", "--set", "matmul=bfloat16", "--run-dir",
                 str(tmp_path / "run"), "--set", "progress=false"])
    assert code != 0
    assert "matmul=bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@pytest.mark.skipif(not precision.native_bfloat16_cpu(), reason="this CPU has no native bfloat16")
def test_bfloat16_runs_only_inside_updates_acting_stays_float32():
    """Two SAC runs, float32 and bfloat16 updates: identical until the first update (acting
    and the warm-up draw are float32), different after it, and both finite."""
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    def run(matmul, steps):
        cfg = build_config("sac", "Pendulum-v1", steps=steps, seed=0,
                           sets=["progress=false", "eval.episodes=0", "tensorboard=false", "learning_starts=200",
                                 f"matmul={matmul}", "hidden=[128,128]"])
        learner = Learner(cfg, None)
        learner.train()
        return [p.detach().clone() for p in learner.algo.actor.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run("float32", 200), run("bfloat16", 200)))
    after32, after16 = run("float32", 260), run("bfloat16", 260)
    assert not all(torch.equal(a, b) for a, b in zip(after32, after16))
    assert all(torch.isfinite(p).all() for p in after16)


def test_a_cnn_encoder_runs_in_bfloat16_inside_the_update_only():
    from corral.nets import NatureCNN

    torch.manual_seed(0)
    net = NatureCNN((4, 84, 84))
    x = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    out32, grads32 = _grads(net, x.float(), lambda n, v: n(v))
    with update_matmul("bfloat16"):
        out16, grads16 = _grads(net, x.float(), lambda n, v: n(v))
    assert out16.dtype == torch.float32 and not torch.equal(out16, out32)
    assert (out16 - out32).norm() <= 2e-2 * out32.norm()
    for g32, g16 in zip(grads32[1:], grads16[1:]):  # the weights' gradients (relu flips show here)
        assert g16.dtype == torch.float32
        assert (g16 - g32).norm() <= 0.15 * g32.norm()  # measured 0.06-0.09: bfloat16 gradients through 4 layers
    assert torch.equal(net(x.float()), out32)  # outside an update: float32, as before


def test_pixels_reach_the_first_convolution_with_the_values_they_had_in_one_pass():
    """``pixels_to_unit``: float32 ``x * (1 / 255)`` outside a bfloat16 update; inside one, the
    bfloat16 values autocast's cast of those float32 pixels gave, for every uint8 value."""
    x = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    ref = x.float() * (1.0 / 255.0)
    assert torch.equal(precision.pixels_to_unit(x), ref)
    with update_matmul("bfloat16"):
        low = precision.pixels_to_unit(x)
    assert low.dtype == torch.bfloat16 and torch.equal(low, ref.to(torch.bfloat16))
    floats = x.float()
    assert torch.equal(precision.pixels_to_unit(floats), ref) and torch.equal(floats, x.float())  # a fresh tensor


def test_the_cnn_in_a_bfloat16_update_computes_what_autocast_on_float32_pixels_did():
    from corral.nets import NatureCNN

    torch.manual_seed(0)
    net = NatureCNN((4, 84, 84))
    x = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    params = list(net.parameters())
    with update_matmul("bfloat16"):
        out = net(x)
    grads = torch.autograd.grad(out.square().sum(), params)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the encoder's forward before pixels_to_unit
        ref = net.fc(net.conv(x.float() * (1.0 / 255.0))).float()
    ref_grads = torch.autograd.grad(ref.square().sum(), params)
    assert torch.equal(out, ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
