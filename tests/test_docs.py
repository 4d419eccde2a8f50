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


def run_page_as_module(page: str, tmp_path, monkeypatch):
    """``docs/<page>``'s python blocks, as one script run as a module (so its classes and
    functions can be named 'module:qualname', as a user's script's are); returns the module."""
    import types

    blocks = python_blocks(DOCS / page)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("_corral_docs_" + Path(page).stem)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{page} block {i + 1}", "exec"), module.__dict__)  # noqa: S102 - the page is ours
        except Exception as e:
            raise AssertionError(f"{page} python block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e
    return module


def test_custom_parts_page_code_runs(tmp_path, monkeypatch):
    module = run_page_as_module("custom.md", tmp_path, monkeypatch)
    assert module.agent.cfg.algo_cfg.features == "_corral_docs_custom:TinyExtractor"
    from corral.algos import ALGOS

    assert ALGOS.pop("counting_ppo").cls is module.CountingPPO  # (registered by the page; removed again)


def test_the_tutorial_composes_a_run_that_learns_cartpole(tmp_path, monkeypatch):
    """docs/tutorial.md: an env factory with per-env monitor logs, PPO with a user's feature
    extractor (an nn.Module class) and a registered storage subclass, a scheme, a stepped
    Learner; the loaded agent holds out at >= 475 on 20 unseen episodes (seed 0, ~20 s alone)."""
    from corral.storage import STORAGES

    module = run_page_as_module("tutorial.md", tmp_path, monkeypatch)
    try:
        assert module.result["mean_return"] >= 475
        assert module.summary["env_steps"] == 100_000 and module.CountingStorage.stored == 100_000
        algo = module.agent.algo
        assert isinstance(algo.actor.extractor, module.TinyExtractor)
        assert module.agent.cfg.env.id == "_corral_docs_tutorial:make_cartpole"  # rebuilt by corral.load
        monitors = sorted((tmp_path / "tutorial" / "monitor").glob("*.monitor.csv"))
        assert [p.name for p in monitors] == [f"{i}.monitor.csv" for i in range(8)]
        rows = sum(len(p.read_text().splitlines()) - 2 for p in monitors)  # a header line and the column names
        assert rows == module.learner.episodes
    finally:
        STORAGES.pop("counting", None)
