"""What code a run ran on: the corral version and, from a git checkout, the commit (with a
fingerprint of uncommitted changes to the package), and the machine."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from pathlib import Path


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_identity() -> dict:
    """``{"version", "commit", "dirty", "id"}``. ``id`` is what resuming compares: the version,
    the commit and, when the package's files differ from the commit, a hash of the difference
    (an installed wheel has no commit: its version alone)."""
    import corral

    pkg = Path(corral.__file__).resolve().parent
    commit = _git("rev-parse", "HEAD", cwd=pkg)
    commit = commit.strip() if commit else None
    dirty = None
    if commit:
        diff = _git("diff", "HEAD", "--", ".", cwd=pkg) or ""
        untracked = _git("ls-files", "--others", "--exclude-standard", "--", ".", cwd=pkg) or ""
        h = hashlib.sha1(diff.encode())
        for name in sorted(untracked.split()):
            path = pkg / name
            if path.suffix in (".py", ".yaml") and path.is_file():
                h.update(name.encode())
                h.update(path.read_bytes())
        dirty = h.hexdigest()[:8] if (diff or untracked.strip()) else None
    ident = corral.__version__ + (f"@{commit[:12]}" if commit else "") + (f"+{dirty}" if dirty else "")
    return {"version": corral.__version__, "commit": commit, "dirty": dirty, "id": ident}


def machine() -> dict:
    """The machine a suite ran on, as the report states it."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pass
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1) if mem else None,
            "python": platform.python_version(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
