"""The public API type-checks under the project's mypy settings (pyproject.toml [tool.mypy]: the
modules behind ``corral.__all__``, not the whole tree). A cold run reads torch's annotations
(about a minute); later runs use ``.mypy_cache`` (seconds)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_clean_on_the_public_api():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with corral[test])")
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
