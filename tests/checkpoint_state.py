"""Comparing checkpoints: every tensor of a checkpoint's algorithm state and random streams."""

from __future__ import annotations

from pathlib import Path

import torch


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's algorithm state (parameters, optimizer, targets, replay)
    and random streams, flat, by path."""
    state = torch.load(path, weights_only=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix, x):
        if isinstance(x, torch.Tensor):
            flat[prefix] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(f"{prefix}.{i}", v)

    walk("algo", state["algo"])
    walk("rng", state["rng"])
    return flat


def assert_same_checkpoint(a: Path, b: Path, name: str = "") -> None:
    ta, tb = checkpoint_tensors(a), checkpoint_tensors(b)
    assert ta.keys() == tb.keys(), name
    for k in ta:
        assert torch.equal(ta[k], tb[k]), f"{name}: {k} differs"
