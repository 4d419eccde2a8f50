"""Compiled kernels: ``compile: true`` in a run's config.

Some parts of an update are many cheap passes over one large tensor in eager PyTorch, each a
trip through memory: TQC's quantile Huber loss is nine passes over ``[B, N*M, kept]`` pairs
(256 x 50 x 46 at the presets), about 2 ms of a ~12 ms step on one core. ``torch.compile``
fuses such a part into one loop that keeps the pairs in registers (about 8x faster here).
It costs ~30-60 s of compiling when the run starts (a C++ compiler on a CPU, Triton on a
GPU), so it pays on runs of ~50k steps or more, and rounds a little differently from the eager
kernel (within the registered tolerance, ``tests/test_kernels.py``); off by default.

The learner runs every update inside ``update_mode(cfg)``: ``cfg.matmul``'s precision and,
with ``cfg.compile``, the compiled kernels (``compiling()``), the way ``update_matmul``
scopes the precision. Acting and evaluation never run under it."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil

import torch

from corral.errors import UserError
from corral.kernels.precision import update_matmul

_on = False  # inside update_mode of a run with compile: true


@contextlib.contextmanager
def update_compile(on: bool):
    """Within it (``on``), the kernels that have a compiled form use it."""
    global _on
    saved = _on
    _on = bool(on)
    try:
        yield
    finally:
        _on = saved


@contextlib.contextmanager
def update_mode(cfg):
    """What an update runs under: ``cfg.matmul``'s precision and ``cfg.compile``'s kernels."""
    with update_matmul(cfg.matmul), update_compile(getattr(cfg, "compile", False)):
        yield


def compiling() -> bool:
    return _on


@functools.cache
def compiled(fn):
    """``torch.compile(fn)`` made once per function (shapes fixed: one graph per shape seen)."""
    return torch.compile(fn, dynamic=False)


def check_compile(on: bool, device: torch.device) -> None:
    """Refuse ``compile: true`` where torch.compile cannot build its kernels."""
    if not on:
        return
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise UserError("compile=true: torch.compile on a GPU needs Triton (pip install triton); "
                            "or leave compile=false")
        return
    cxx = os.environ.get("CXX")
    if not any(shutil.which(c) for c in ([cxx] if cxx else []) + ["g++", "c++", "clang++"]):
        raise UserError("compile=true: torch.compile on a CPU needs a C++ compiler and none was found "
                        "(apt install g++, or set CXX); or leave compile=false")
