"""corral/bench/peers.yaml (published results of the peers) and its loader."""

import textwrap
from importlib import resources

import pytest
import yaml

from corral.bench.peers import Peer, load_peers
from corral.errors import UserError

HEAD = """\
sources:
  zoo:
    title: a benchmark table
    url: https://example.org/zoo
    version: "abc123"
    kind: eval
    protocol: "final agent, deterministic"
  other:
    title: another table
    url: https://example.org/other
    version: "v1"
    kind: train
    protocol: "training returns"
results:
"""


def write(tmp_path, results: str, head: str = HEAD):
    path = tmp_path / "peers.yaml"
    path.write_text(head + textwrap.indent(textwrap.dedent(results), "  "))
    return path


@pytest.fixture()
def small(tmp_path):
    return load_peers(write(tmp_path, """\
        - {source: zoo, algo: ppo, env: LunarLander-v2, steps: 1000000, seeds: 1, value: 242.1, std: 31.8}
        - {source: zoo, algo: ppo, env: CartPole-v1, steps: 1000000, seeds: 1, value: 500.0, std: 0.0}
        - {source: zoo, algo: ppo, env: CartPole-v1, steps: 500000, seeds: 1, value: 499.0}
        - {source: other, algo: ppo, env: CartPole-v1, steps: 100000, seeds: 3, value: 490.0, std: 6.1}
        - {source: other, algo: ppo, env: CartPole-v1, steps: 2000000, seeds: 3, value: 500.0}
        - {source: other, algo: dqn, env: CartPole-v1, steps: 50000, seeds: 3, value: 480.0, kind: eval, note: n}
        """))


def test_packaged_table_loads_and_validates():
    table = load_peers()
    assert len(table) > 100
    assert {"rl-zoo", "cleanrl", "tianshou", "sb3-contrib"} <= set(table.sources)
    for key, src in table.sources.items():
        assert src["url"].startswith("https://github.com/"), key
        assert src["kind"] in ("eval", "train")
    # every entry of the raw file became a checked Peer
    raw = yaml.safe_load(resources.files("corral.bench").joinpath("peers.yaml").read_text("utf-8"))
    assert len(raw["results"]) == len(table)
    for p in table.peers:
        assert isinstance(p, Peer)
        assert p.steps >= 1 and p.seeds >= 1 and isinstance(p.value, float)
        assert p.source in table.sources and p.url == table.sources[p.source]["url"]


def test_packaged_table_has_the_priority_cells():
    table = load_peers()
    (zoo,) = table.published("CartPole-v1", "ppo", 100_000, sources=["rl-zoo"])
    assert (zoo.value, zoo.std, zoo.seeds, zoo.kind) == (500.0, 0.0, 1, "eval")
    assert zoo.describe() == "rl-zoo 500.0 ± 0.0 (1 seed, 100k steps, eval)"
    # rl-zoo lists LunarLander-v2 only: nothing is quoted for corral's LunarLander-v3
    assert table.published("LunarLander-v2", "ppo", sources=["rl-zoo"])
    assert table.published("LunarLander-v3") == []
    assert "HalfCheetah-v4" in table.envs() and "HalfCheetah-v3" in table.envs()
    for p in table.published("PongNoFrameskip-v4"):
        assert p.steps == 10_000_000  # agent steps (40M frames)


def test_budget_rule(small):
    at_500k = small.published("CartPole-v1", "ppo", 500_000, sources=["zoo"])
    assert [p.steps for p in at_500k] == [500_000]  # the 1M figure is not quoted for a 500k cell
    at_1m = small.published("CartPole-v1", "ppo", 1_000_000, sources=["zoo"])
    assert [p.steps for p in at_1m] == [500_000, 1_000_000]
    assert small.published("CartPole-v1", "ppo", 499_999, sources=["zoo"]) == []
    assert len(small.published("CartPole-v1", "ppo")) == 4  # no budget: any


def test_version_rule(small):
    assert small.published("LunarLander-v3", "ppo") == []
    assert small.published("LunarLander", "ppo") == []
    assert [p.value for p in small.published("LunarLander-v2", "ppo")] == [242.1]


def test_algo_and_sources_filter_and_order(small):
    everything = small.published("CartPole-v1")
    assert [(p.source, p.steps) for p in everything] == [
        ("other", 50_000), ("other", 100_000), ("other", 2_000_000), ("zoo", 500_000), ("zoo", 1_000_000)]
    assert [p.steps for p in small.published("CartPole-v1", "ppo", sources=["other"])] == [100_000, 2_000_000]
    assert small.published("CartPole-v1", "dqn", sources=["zoo"]) == []
    (dqn,) = small.published("CartPole-v1", "dqn")
    assert dqn.kind == "eval" and dqn.note == "n"  # the entry's kind overrides the source's
    (ppo_other,) = small.published("CartPole-v1", "ppo", 1_000_000, sources=["other"])
    assert ppo_other.kind == "train" and ppo_other.protocol == "training returns"
    assert ppo_other.describe() == "other 490.0 ± 6.1 (3 seeds, 100k steps, train)"
    (no_std,) = small.published("CartPole-v1", "ppo", 500_000, sources=["zoo"])
    assert no_std.std is None and no_std.describe() == "zoo 499.0 (1 seed, 500k steps, eval)"
    with pytest.raises(UserError, match="nope"):
        small.published("CartPole-v1", sources=["nope"])
    assert small.envs() == ["CartPole-v1", "LunarLander-v2"]


@pytest.mark.parametrize("entry, field", [
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: high}", "value"),
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1e6, seeds: 1, value: 1.0}", "steps"),
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, value: 1.0}", "seeds"),
    ("{source: nobody, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: 1.0}", "source"),
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: 1.0, std: '2'}", "std"),
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: 1.0, kind: best}", "kind"),
    ("{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: 1.0, valu: 2}", "valu"),
])
def test_malformed_entry_names_entry_and_field(tmp_path, entry, field):
    path = write(tmp_path, f"""\
        - {{source: zoo, algo: ppo, env: CartPole-v1, steps: 1000, seeds: 1, value: 1.0}}
        - {entry}
        """)
    with pytest.raises(UserError) as err:
        load_peers(path)
    msg = str(err.value)
    assert "results entry 1" in msg and f"'{field}'" in msg, msg


def test_malformed_source_and_file(tmp_path):
    head = HEAD.replace("    kind: train\n", "")
    with pytest.raises(UserError, match=r"source 'other'.*'kind'"):
        load_peers(write(tmp_path, "- {source: zoo, algo: a, env: E-v0, steps: 1, seeds: 1, value: 0}\n",
                         head))
    (tmp_path / "bad.yaml").write_text("results: [")
    with pytest.raises(UserError, match="not valid YAML"):
        load_peers(tmp_path / "bad.yaml")
    with pytest.raises(UserError, match="cannot read"):
        load_peers(tmp_path / "missing.yaml")


@pytest.mark.parametrize("source, envs, steps, seeds, kind", [
    ("dopamine", ("ALE/Pong-v5", "ALE/Breakout-v5"), 2_500_000, 5, "train"),
    ("simbav2", ("HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4"), 300_000, 10, "eval"),
])
def test_figures_computed_from_per_seed_files_are_the_mean_of_the_seeds_they_quote(source, envs, steps, seeds, kind):
    """Dopamine and SimbaV2 publish per-seed values only; each entry is their mean (std over seeds)."""
    import re
    import statistics

    table = load_peers()
    for env in envs:
        found = table.published(env, sources=[source])
        assert found, env
        for p in found:
            quoted = [float(v) for v in re.search(r"per seed (.*)$", p.note).group(1).split(", ")]
            assert (p.steps, p.seeds, p.kind) == (steps, seeds, kind) and len(quoted) == seeds
            assert p.value == pytest.approx(statistics.mean(quoted), abs=0.6)  # the quoted seeds are rounded
            assert p.std == pytest.approx(statistics.stdev(quoted), abs=0.6)


def test_dopamines_and_simbav2s_figures_are_those_the_issues_quote():
    """Dopamine at 10M frames (2.5M agent steps): Rainbow 15.2 on Pong, IQN 102.7 on Breakout;
    SimbaV2's baselines at 300k: SAC 8593 / 2160 / 2470 / 3532 / 3015, CrossQ 10012 on HalfCheetah."""
    table = load_peers()
    found = table.published("ALE/Pong-v5", sources=["dopamine"])
    assert {p.algo for p in found} == {"rainbow", "iqn", "qrdqn", "c51", "dqn"}
    sac = [table.published(f"{e}-v4", "sac", 300_000, ["simbav2"])[0].value
           for e in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")]
    assert [round(v) for v in sac] == [8593, 2160, 2470, 3532, 3015]
    assert round(table.published("HalfCheetah-v4", "crossq", 300_000, ["simbav2"])[0].value) == 10012
    (rainbow,) = table.published("ALE/Pong-v5", "rainbow", 2_500_000)
    assert rainbow.describe() == "dopamine 15.2 ± 1.668 (5 seeds, 2.5M steps, train)"
    (iqn,) = table.published("ALE/Breakout-v5", "iqn")
    assert round(iqn.value, 1) == 102.7
    assert table.published("ALE/Pong-v5", "rainbow", 2_499_999) == []  # not quoted below its budget
