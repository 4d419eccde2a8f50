"""Every algorithm in the registry has a docs page, and every page can be reached.

A page documents the registry names written in backticks in its title (the first line,
``# ...``); a variant that is its base with flags set may share its base's page that way
(``dqn.md`` names ``double_dqn``, ``d3qn``, ...). Each page is linked from
docs/algorithms.md and is in mkdocs.yml's nav, listed by path or through the
awesome-pages ``...`` entry that fills in docs/algos/."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from corral.algos import ALGOS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted((DOCS / "algos").glob("*.md"))


def title_names(page: Path) -> set[str]:
    """The backticked names in the page's first line, which must be its ``# `` title."""
    first = page.read_text().split("\n", 1)[0]
    assert first.startswith("# "), f"{page.relative_to(ROOT)} does not start with a '# ' title"
    return set(re.findall(r"`([A-Za-z0-9_]+)`", first))


def nav_entries(items) -> list[str]:
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for v in item.values():
                out.extend(nav_entries(v if isinstance(v, list) else [v]))
    return out


def test_there_are_algorithm_pages_and_registry_names():
    assert len(PAGES) >= 20 and len(ALGOS) >= 40  # the checks below are not vacuous


def test_every_registry_name_has_a_page_naming_it_in_its_title():
    documented = {name: page.name for page in PAGES for name in title_names(page)}
    missing = sorted(set(ALGOS) - set(documented))
    assert not missing, (f"registry names without a docs page: {missing}; add docs/algos/<name>.md (docs/algos/tqc.md "
                         "is the format), or name the variant in backticks in its base page's title")


def test_page_titles_name_only_registry_names():
    unknown = {page.name: sorted(title_names(page) - set(ALGOS)) for page in PAGES}
    unknown = {k: v for k, v in unknown.items() if v}
    assert not unknown, f"page titles naming something that is not in corral.algos.ALGOS: {unknown}"
    untitled = [page.name for page in PAGES if not title_names(page) and page.name not in OPTION_PAGES]
    assert not untitled, f"pages whose title names no registry name in backticks: {untitled}"


# pages of an option every replay algorithm takes, not of an algorithm: the option they name
OPTION_PAGES = {"her.md": ("replay", "her")}


def test_option_pages_name_an_option_that_exists():
    from corral.algos.offpolicy import OffPolicyConfig
    from corral.storage import storage_class
    from corral.storage.replay import ReplayBuffer

    for page, (key, value) in OPTION_PAGES.items():
        assert f"`{key}={value}`" in (DOCS / "algos" / page).read_text().splitlines()[0], page
        assert key in OffPolicyConfig.__dataclass_fields__
        assert issubclass(storage_class(value, ReplayBuffer, key), ReplayBuffer)


def test_every_algorithm_page_is_linked_from_the_algorithms_overview():
    overview = (DOCS / "algorithms.md").read_text()
    unlinked = [page.name for page in PAGES if f"(algos/{page.name})" not in overview]
    assert not unlinked, f"docs/algorithms.md's list of algorithm pages lacks: {unlinked}"


def test_every_algorithm_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_entries(config["nav"])
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])]
    rest = "..." in listed and "awesome-pages" in plugins  # awesome-pages puts every unlisted page there
    pages_file = DOCS / "algos" / ".pages"
    local = yaml.safe_load(pages_file.read_text()) or {} if pages_file.is_file() else {}
    assert not local.get("hide"), "docs/algos/.pages hides the algorithm pages from the nav"
    if "nav" in local:  # a .pages nav lists the folder's pages itself; '...' there stands for the rest
        rest = rest and "..." in nav_entries(local["nav"])
        listed += [f"algos/{p}" for p in nav_entries(local["nav"])]
    missing = [page.name for page in PAGES if f"algos/{page.name}" not in listed and not rest]
    assert not missing, f"algorithm pages missing from mkdocs.yml's nav: {missing}"
