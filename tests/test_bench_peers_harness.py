"""benchmarks/bench_peers.py: its run order, the figures it derives from recorded runs, and the
command line of a pinned run (nothing here starts a run or needs JAX)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_peers as bp  # noqa: E402


def test_two_rounds_run_each_seed_in_a_b_b_a_order():
    order = bp.schedule(["corral", "sbx", "sb3"], [0, 1], rounds=2)
    assert [lib for s, _, lib in order if s == 0] == ["corral", "sbx", "sb3", "sb3", "sbx", "corral"]
    assert [lib for s, _, lib in order if s == 1] == ["corral", "sbx", "sb3", "sb3", "sbx", "corral"]
    assert [r for s, r, _ in order if s == 1] == [0, 0, 0, 1, 1, 1]


def test_one_round_alternates_the_order_from_seed_to_seed():
    order = bp.schedule(["a", "b"], [0, 1, 2], rounds=1)
    assert order == [(0, 0, "a"), (0, 0, "b"), (1, 0, "b"), (1, 0, "a"), (2, 0, "a"), (2, 0, "b")]


def test_time_to_return_is_where_the_last_20_mean_first_reaches_the_target():
    # 19 episodes of 500 then one of 450: the first full window has mean 497.5 (>= 475)
    curve = [[0.1 * i, 100 * i, 500.0] for i in range(19)] + [[1.9, 1900, 450.0]]
    assert bp.time_to_return(curve, 475.0) == (1.9, 1900)
    # fewer than 20 episodes never count, however high
    assert bp.time_to_return(curve[:19], 475.0) is None


def test_time_to_return_slides_the_window_and_drops_old_episodes():
    # 20 episodes of 0 then 500s: the window's mean reaches 475 once 19 of its 20 are 500
    curve = [[i, i, 0.0] for i in range(20)] + [[20 + i, 20 + i, 500.0] for i in range(30)]
    hit = bp.time_to_return(curve, 475.0)
    assert hit == (38, 38)  # window 19..38: one 0 and nineteen 500s = 475
    assert bp.time_to_return(curve, 475.0, window=1) == (20, 20)
    assert bp.time_to_return(curve, 501.0) is None
    assert bp.last_return(curve) == 500.0


def run(lib, seed, train, to=None, ev=100.0, rnd=0, **kw):
    return {"cell": "ppo-cartpole", "lib": lib, "seed": seed, "round": rnd, "train_s": train,
            "to_target_s": to, "eval": ev, **kw}


def test_summary_takes_medians_per_seed_and_overall_and_ratios_against_corral():
    runs = [run("corral", 0, 10.0, 4.0), run("corral", 0, 12.0, 6.0, rnd=1), run("corral", 1, 20.0, 8.0),
            run("sb3", 0, 30.0, 12.0), run("sb3", 0, 34.0, 14.0, rnd=1), run("sb3", 1, 40.0, None, ev=50.0)]
    s = bp.summarize(runs)["ppo-cartpole"]
    assert s["corral"]["train_s"]["per_seed"] == {0: 11.0, 1: 20.0}
    assert s["corral"]["train_s"]["median"] == 12.0
    assert s["sb3"]["train_s"]["median"] == 34.0  # over every run, not over the seeds' medians
    assert s["sb3"]["corral/lib train_s"] == pytest.approx(12.0 / 34.0)
    # a run that never reached the target is left out of the median and counted as not reached
    assert s["sb3"]["to_target_s"]["per_seed"] == {0: 13.0, 1: None}
    assert s["sb3"]["reached"] == "2/3"
    assert s["sb3"]["corral/lib to_target_s"] == pytest.approx(6.0 / 13.0)
    assert s["sb3"]["eval"]["per_seed"] == {0: 100.0, 1: 50.0}
    assert s["corral"]["corral/lib train_s"] == 1.0


def test_compile_inclusive_time_is_compared_with_corrals_time_to_target():
    runs = [run("corral", 0, 10.0, 5.0),
            run("purejaxrl", 0, 2.0, 1.0, compile_s=9.0, to_target_incl_compile_s=10.0)]
    s = bp.summarize(runs)["ppo-cartpole"]["purejaxrl"]
    assert s["compile_s"]["median"] == 9.0
    assert s["corral/lib to_target_s"] == 5.0
    assert s["corral/lib to_target_incl_compile_s"] == 0.5


def test_a_pinned_run_is_on_core_0_with_every_thread_pool_at_one():
    cmd, env = bp.pinned_command("/py", ["--worker", "sbx"], 1, script="/b.py")
    assert cmd == ["taskset", "-c", "0", "/py", "/b.py", "--worker", "sbx", "--threads", "1"]
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    assert env["JAX_PLATFORMS"] == "cpu"


def test_two_cores_pin_both_and_give_every_pool_two_threads():
    cmd, env = bp.pinned_command("/py", [], 2, script="/b.py")
    assert cmd[:3] == ["taskset", "-c", "0,1"] and cmd[-2:] == ["--threads", "2"]
    assert env["OMP_NUM_THREADS"] == "2"
    assert "intra_op_parallelism_threads=2" in env["XLA_FLAGS"]
    assert "multi_thread_eigen=true" in env["XLA_FLAGS"]


def test_episode_lines_of_cleanrl_and_leanrl_parse():
    assert bp.EPISODE_LINE.search("global_step=512, episodic_return=[23.]").groups() == ("512", "23.")
    assert bp.EPISODE_LINE.search("speed: 900 sps, global_step=1200, episodic_return=tensor(23.45)").groups() \
        == ("1200", "23.45")
    assert bp.EPISODE_LINE.search("global_step=3000, episodic_return= -1234.56 (max=-900.00)").groups() \
        == ("3000", "-1234.56")
