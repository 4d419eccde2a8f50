"""The report on Atari cells: budgets and curves in emulator frames beside agent steps, and
Dopamine's 10M-frame figures beside the value family's Pong cell."""

import pytest

from corral.bench import report
from corral.bench.suite import parse_suite

SUITE = {
    "name": "frames",
    "seeds": 1,
    "eval": {"episodes": 2, "points": 2},
    "peers": ["dopamine"],
    "envs": {"ALE/Pong-v5": {"steps": 2_500_000}, "CartPole-v1": {"steps": 50_000},
             "ALE/Breakout-v5": {"steps": 1000, "frames_per_step": 2}},
    "grid": [{"algos": ["rainbow"], "envs": ["ALE/Pong-v5", "CartPole-v1", "ALE/Breakout-v5"]}],
}


def results() -> report.Results:
    suite = parse_suite(SUITE, source="frames.yaml")
    runs, evals = [], []
    for _, env, steps, _ in suite.cells:
        ident = {"suite": "frames", "env": env, "algo": "rainbow", "seed": 0}
        runs.append({**ident, "budget": steps, "status": "done", "env_steps": steps, "final_return": 16.0,
                     "cpu_s": 3600.0, "wall_s": 3600.0, "code": "abc", "code_changed": False, "given": None})
        evals += [{**ident, "step": s, "wall_s": 1.0 * s, "cpu_s": 1.0 * s, "return": 1.0, "return_std": 0.0,
                   "episodes": 2} for s in (steps // 2, steps)]
    return report.Results(suite, "", {}, runs, evals)


def test_frames_per_step_is_four_on_atari_ids_unless_the_suite_says():
    suite = results().suite
    assert suite.frames_per_step("ALE/Pong-v5") == 4
    assert suite.frames_per_step("PongNoFrameskip-v4") == 4
    assert suite.frames_per_step("CartPole-v1") == 1
    assert suite.frames_per_step("ALE/Breakout-v5") == 2


def test_the_table_gives_atari_budgets_in_frames_and_quotes_dopamine_at_ten_million():
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.markdown(results(), reps=20).splitlines()
            if line.startswith("| ") and "rainbow" in line}
    assert " | 2.5M (10M frames) | " in rows["ALE/Pong-v5"]
    assert "dopamine 15.2 ± 1.668 (5 seeds, 2.5M steps, train)" in rows["ALE/Pong-v5"]
    assert " | 50k | " in rows["CartPole-v1"] and "frames" not in rows["CartPole-v1"]
    assert " | 1k (2k frames) | " in rows["ALE/Breakout-v5"]


def test_the_atari_curve_is_drawn_against_frames(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn = {}
    saved = Figure.savefig

    def keep(fig, *a, **k):
        drawn["axes"] = fig.axes
        return saved(fig, *a, **k)

    Figure.savefig = keep
    try:
        report.plot_curves(results(), "ALE/Pong-v5", tmp_path / "pong.png", reps=20)
    finally:
        Figure.savefig = saved
    ax = drawn["axes"][0]
    assert ax.get_xlabel() == "frames (4 per agent step)"
    assert list(ax.lines[0].get_xdata()) == [5_000_000, 10_000_000]  # 1.25M and 2.5M agent steps
