"""Checkpoints: one file, the whole training state, versioned, written atomically,
read with ``torch.load(weights_only=True)`` so loading never runs pickled code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from corral.errors import UserError

FORMAT = "corral-checkpoint"
VERSION = 1


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` via a temp file in the same folder and an atomic rename,
    so a crash mid-write leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    payload = {"format": FORMAT, "version": VERSION, **state}
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, wrong format, pickled code, ...
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "Unsupported global" in ln), lines[0] if lines else "")
        raise UserError(
            f"checkpoint {str(path)!r} is corrupt or not a corral checkpoint ({type(e).__name__}: "
            f"{detail[:300]}); use another checkpoint from the run's checkpoints/ folder"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {str(path)!r} is not a corral checkpoint (no '{FORMAT}' header)")
    if int(state.get("version", -1)) > VERSION:
        raise UserError(
            f"checkpoint {str(path)!r} has format version {state['version']}, newer than this corral "
            f"understands ({VERSION}); upgrade corral"
        )
    for key in ("config", "algo"):
        if key not in state:
            raise UserError(f"checkpoint {str(path)!r} is incomplete: it has no {key!r} section")
    return state


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its best, else latest, checkpoint)."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.pt", "latest.pt"):
            for cand in (path / "checkpoints" / name, path / name):
                if cand.is_file():
                    return cand
        raise UserError(f"{str(path)!r} holds no checkpoint (looked for checkpoints/best.pt and checkpoints/latest.pt)")
    if not path.exists():
        raise UserError(f"{str(path)!r} does not exist: give a run directory or a checkpoint file")
    return path
