"""The documentation site: it builds with ``mkdocs build --strict`` (when mkdocs is
installed), every ```python block of the getting-started page runs, and the nav picks up
every page in docs/ (algorithm pages through the awesome-pages plugin's ``...`` entry)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_getting_started_code_runs(tmp_path, monkeypatch):
    blocks = python_blocks(DOCS / "getting-started.md")
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)  # the page writes runs/ and files where it runs
    namespace: dict = {"__name__": "__getting_started__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"getting-started.md block {i + 1}", "exec"), namespace)  # noqa: S102 - the page is ours
        except Exception as e:  # name the block that failed
            raise AssertionError(f"getting-started.md python block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e
    assert (tmp_path / "policy.pt").is_file()
    assert (tmp_path / "runs" / "quickstart" / "checkpoints" / "latest.pt").is_file()


def test_every_page_is_in_the_nav():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold !!python/name tags (pymdownx options); none are needed here
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    listed: set[str] = set()

    def walk(items):
        for item in items:
            if isinstance(item, str):
                listed.add(item)
            elif isinstance(item, dict):
                for v in item.values():
                    walk(v if isinstance(v, list) else [v])

    walk(config["nav"])
    assert "..." in listed, "the nav's '...' entry (awesome-pages) lists docs/algos/*.md"
    top = {p.name for p in DOCS.glob("*.md")}
    assert top <= listed, f"pages not in mkdocs.yml's nav: {sorted(top - listed)}"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("mkdocs_awesome_pages_plugin")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    cmd = [mkdocs] if mkdocs else [sys.executable, "-m", "mkdocs"]
    out = subprocess.run([*cmd, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "api" / "index.html").is_file()
    api = (site / "api" / "index.html").read_text()
    assert "corral.train" in api and "TrainConfig" in api and "export_agent" in api
    # an algorithm page added to docs/algos/ shows in the nav without editing mkdocs.yml
    assert "algos/c51/" in (site / "index.html").read_text()


def test_custom_parts_page_code_runs(tmp_path, monkeypatch):
    """docs/custom.md's blocks, as one script run as a module (so its classes can be named
    'module:qualname', as a user's script's are from __main__)."""
    import sys
    import types

    blocks = python_blocks(DOCS / "custom.md")
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("_corral_docs_custom")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"custom.md block {i + 1}", "exec"), module.__dict__)  # noqa: S102 - the page is ours
        except Exception as e:
            raise AssertionError(f"custom.md python block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e
    assert module.agent.cfg.algo_cfg.features == "_corral_docs_custom:TinyExtractor"
    from corral.algos import ALGOS

    assert ALGOS.pop("counting_ppo").cls is module.CountingPPO  # (registered by the page; removed again)
