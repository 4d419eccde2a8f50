"""The matmul precision of a gradient update: ``float32`` (the default) or ``bfloat16``.

Under ``update_matmul("bfloat16")`` the wide layers of corral's MLPs (both sides at least
``WIDE`` units: the hidden-to-hidden layers of a 256x256 net) multiply in bfloat16, the way
mixed-precision training does on accelerators: the weights stay float32 (the optimizer's
master copy), each matmul casts its two operands to bfloat16 and its product back to
float32, the bias, activation, losses and optimizer run in float32. The narrow layers (an
observation's few inputs, a critic's one output, a policy's logits) keep float32, so a Q
value or a log-probability is never rounded to bfloat16's 8 bits. On a CPU with native
bfloat16 dot products (AVX512-BF16 or AMX: AMD Zen 4 and later, Intel Sapphire Rapids and
later) a 256-wide matmul takes about half its float32 time; without them bfloat16 is
emulated and slower, so ``check_matmul`` refuses it.

Convolutional encoders (``NatureCNN``) run their whole stack under torch's autocast
instead (``autocast_low``): convolutions are wide layers throughout.

Only updates run under it (the learner enters it around ``algo.update``): acting,
evaluation and exported policies multiply in float32."""

from __future__ import annotations

import contextlib
import functools

import torch

from corral.errors import UserError

MATMULS = ("float32", "bfloat16")
WIDE = 64  # a layer multiplies in low precision when its inputs and outputs both reach this

_low: torch.dtype | None = None  # the update's low-precision dtype while inside update_matmul


@contextlib.contextmanager
def update_matmul(name: str):
    """Within it, wide layers multiply in ``name`` (``float32``: nothing changes)."""
    global _low
    saved = _low
    _low = torch.bfloat16 if name == "bfloat16" else None
    try:
        yield
    finally:
        _low = saved


def autocast_low(device_type: str):
    """A convolutional encoder's forward inside a bfloat16 update: torch's autocast (convolutions
    and their linear layer in bfloat16, float32 weights); a no-op context otherwise. The
    encoder casts its features back to float32."""
    if _low is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=_low)


def pixels_to_unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels scaled to [0, 1] in one pass (a fresh tensor), in the dtype a convolutional
    encoder's first layer multiplies in: bfloat16 inside a bfloat16 update (the values autocast's
    cast of the float32 pixels would give: an integer up to 255 is exact in bfloat16 and the
    product rounds once, so the float32 intermediate and its cast are skipped), float32 otherwise
    (``x.float() * (1 / 255)``'s values)."""
    return x.to(_low or torch.float32, copy=True).mul_(1.0 / 255.0)


def low_dtype(weight: torch.Tensor) -> torch.dtype | None:
    """The dtype ``weight``'s layer multiplies in now (``[out, in]`` or ``[n, out, in]``):
    bfloat16 inside a bfloat16 update for a wide layer, else None (its own float32)."""
    if _low is None or weight.shape[-1] < WIDE or weight.shape[-2] < WIDE:
        return None
    return _low


def mm(a: torch.Tensor, b: torch.Tensor, low: torch.dtype | None) -> torch.Tensor:
    """``a @ b`` (2-d or batched), its operands in ``low`` when given, the product float32."""
    op = torch.bmm if a.dim() == 3 else torch.mm
    if low is None:
        return op(a, b)
    return op(a.to(low), b.to(low)).float()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` under the update's precision (plain autograd carries the casts' gradients)."""
    low = low_dtype(weight)
    if low is None:
        return torch.nn.functional.linear(x, weight, bias)
    out = torch.nn.functional.linear(x.to(low), weight.to(low)).float()
    return out if bias is None else out + bias


def baddbmm(bias: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``torch.baddbmm(bias, x, weight_t)`` (``weight_t``: ``[n, in, out]``) under the update's precision."""
    low = low_dtype(weight_t)
    if low is None:
        return torch.baddbmm(bias, x, weight_t)
    return torch.bmm(x.to(low), weight_t.to(low)).float() + bias


@functools.cache
def native_bfloat16_cpu() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (Linux's /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def check_matmul(name: str, device: torch.device) -> None:
    """Refuse a matmul precision this device cannot run faster than float32."""
    if name not in MATMULS:
        raise UserError(f"matmul={name!r}: choose one of {', '.join(MATMULS)}")
    if name == "float32":
        return
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise UserError(f"matmul=bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16 support; "
                            "use matmul=float32")
        return
    if device.type == "cpu" and not native_bfloat16_cpu():
        raise UserError("matmul=bfloat16: this CPU has no bfloat16 dot-product instructions (AVX512-BF16 or AMX), "
                        "so bfloat16 would be emulated and slower than float32; use matmul=float32")
