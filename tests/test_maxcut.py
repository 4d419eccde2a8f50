"""MaxCut: cut values, the flip env's rewards and resets, the best-cut tracker, Gset files,
graph generators, the solver against brute force, and `corral solve` in-process."""

import argparse
import itertools
import json

import pytest
import torch

from corral.errors import UserError
from corral.problems import (
    MaxCutEnv,
    NodePolicy,
    barabasi_albert,
    brute_force_maxcut,
    cut_value,
    erdos_renyi,
    from_edges,
    local_search,
    read_gset,
    solve_maxcut,
    write_gset,
)
from corral.solve import add_solve_parser, read_assignment

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def plain_cut(graph, sides):
    return sum(w for a, b, w in zip(graph.u.tolist(), graph.v.tolist(), graph.w.tolist()) if sides[a] != sides[b])


def signed_graph(n=9, seed=0):
    return erdos_renyi(n, 0.5, seed=seed, weights=(1.0, -1.0))


# ---------------------------------------------------------------------------------- cut values


def test_cut_value_matches_a_plain_loop_for_every_assignment():
    g = signed_graph(7, seed=1)
    all_sides = list(itertools.product([0, 1], repeat=g.n))
    values = cut_value(g, torch.tensor(all_sides))
    assert values.tolist() == [plain_cut(g, s) for s in all_sides]


def test_cut_value_takes_01_bool_and_pm1_alike():
    g = signed_graph(8, seed=2)
    x = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    assert cut_value(g, x) == cut_value(g, x.bool()) == cut_value(g, 2 * x - 1) == plain_cut(g, x.tolist())


def test_brute_force_finds_the_maximum_of_a_plain_enumeration():
    g = signed_graph(10, seed=3)
    best, x = brute_force_maxcut(g)
    assert best == max(plain_cut(g, s) for s in itertools.product([0, 1], repeat=g.n))
    assert cut_value(g, x) == best


def test_known_cuts_triangle_and_even_cycle():
    triangle = from_edges(3, [(0, 1), (1, 2), (0, 2)])
    square = from_edges(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
    assert brute_force_maxcut(triangle)[0] == 2
    assert brute_force_maxcut(square)[0] == 4


# ---------------------------------------------------------------------------------- the env


@pytest.mark.parametrize("graph", [signed_graph(12, seed=4), barabasi_albert(15, 2, seed=0)], ids=["er", "ba"])
def test_reward_is_the_change_of_the_cut(graph):
    env = MaxCutEnv(graph, 6, episode_length=9, seed=0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        before = cut_value(graph, env.s)
        obs, reward, terminated, truncated, info = env.step(torch.randint(graph.n, (6,), generator=gen))
        assert torch.allclose(info["cut"] - before, reward.double())
        assert not terminated.any()
        if not truncated.any():
            assert torch.allclose(cut_value(graph, env.s), env.cut)
            assert torch.allclose(cut_value(graph, env.s), info["cut"])


def test_gains_in_the_observation_are_the_cut_change_of_each_flip():
    g = signed_graph(10, seed=5)
    env = MaxCutEnv(g, 3, seed=1)
    obs = env.reset(seed=1)
    for node in range(g.n):
        flipped = env.s.clone()
        flipped[:, node] *= -1
        expected = cut_value(g, flipped) - cut_value(g, env.s)
        assert torch.allclose(obs[:, 0, node].double() * env.scale, expected, atol=1e-5)


def test_autoreset_truncates_every_env_after_the_episode_length_and_restarts_in_the_same_step():
    g = signed_graph(10, seed=6)
    start = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 1, 1])
    env = MaxCutEnv(g, 4, episode_length=5, seed=0)
    env.start_from(start, flip_prob=0.0)
    obs = env.reset()
    gen = torch.Generator().manual_seed(1)
    total = torch.zeros(4, dtype=torch.float64)
    for t in range(1, 11):
        obs, reward, terminated, truncated, info = env.step(torch.randint(g.n, (4,), generator=gen))
        total += reward.double()
        assert not terminated.any()
        if t % 5:
            assert not truncated.any()
            assert torch.equal(info["final_obs"], obs)
            continue
        assert truncated.all()
        assert torch.allclose(info["episode_return"].double(), total)  # sum of deltas = cut change
        assert (info["episode_length"] == 5).all()
        assert not torch.equal(info["final_obs"], obs)
        # the new episode: the start assignment, no recent flips, at its own best
        assert torch.equal(env.s, (2.0 * start - 1).expand(4, -1))
        assert (obs[:, 1] == 0).all() and (obs[:, 2] == 0).all()
        total.zero_()


def test_best_reward_sums_to_the_rise_of_the_episode_best():
    g = signed_graph(12, seed=7)
    env = MaxCutEnv(g, 5, episode_length=30, seed=2, reward="best")
    start_cut = env.cut.clone()
    gen = torch.Generator().manual_seed(2)
    best, total = start_cut.clone(), torch.zeros(5, dtype=torch.float64)
    for _ in range(29):
        _, reward, _, _, info = env.step(torch.randint(g.n, (5,), generator=gen))
        assert (reward >= 0).all()
        total += reward.double()
        best = torch.maximum(best, info["cut"])
    assert torch.allclose(total, best - start_cut)


def test_the_tracker_keeps_the_best_cut_ever_seen_and_its_assignment():
    g = signed_graph(12, seed=8)
    env = MaxCutEnv(g, 8, episode_length=7, seed=3)
    seen = env.cut.max().item()
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        _, _, _, _, info = env.step(torch.randint(g.n, (8,), generator=gen))
        seen = max(seen, info["cut"].max().item(), env.cut.max().item())
    assert env.best_cut.item() == seen
    assert cut_value(g, env.best_assignment).item() == seen


def test_state_dict_round_trip_continues_bit_for_bit():
    g = barabasi_albert(30, 3, seed=1)
    a = MaxCutEnv(g, 4, episode_length=11, seed=5)
    gen = torch.Generator().manual_seed(5)
    acts = torch.randint(g.n, (40, 4), generator=gen)
    for t in range(13):
        a.step(acts[t])
    b = MaxCutEnv(g, 4, episode_length=11, seed=99)
    b.load_state_dict(a.state_dict())
    for t in range(13, 40):
        oa, ra, *_ = a.step(acts[t])
        ob, rb, *_ = b.step(acts[t])
        assert torch.equal(oa, ob) and torch.equal(ra, rb)
    assert torch.equal(a.best_cut, b.best_cut)


def test_bad_actions_name_the_problem():
    env = MaxCutEnv(signed_graph(6), 3, seed=0)
    with pytest.raises(Exception, match=r"expected \(3,\)"):
        env.step(torch.zeros(4, dtype=torch.long))
    with pytest.raises(Exception, match="integer node ids"):
        env.step(torch.zeros(3))


def test_local_search_ends_in_a_one_flip_local_optimum():
    g = barabasi_albert(60, 3, seed=2)
    env = MaxCutEnv(g, 5, seed=4)
    before = env.cut.clone()
    local_search(env)
    assert (env.gain <= 1e-6).all()
    assert (env.cut >= before).all()
    assert torch.allclose(cut_value(g, env.s), env.cut)


@pytest.mark.parametrize("device", DEVICES)
def test_env_policy_and_trainer_stay_on_the_device(device):
    g = signed_graph(16, seed=9)
    env = MaxCutEnv(g, 4, episode_length=8, device=device, seed=0)
    from corral.problems.maxcut_solver import ppo_config, ppo_with_actor
    from corral.train.learner import Learner

    cfg = ppo_config(4, 0, device, {"n_steps": 4, "batch_size": 8, "n_epochs": 1})
    learner = Learner(cfg, env=env, algo_cls=ppo_with_actor(NodePolicy(g.n)), quiet=True)
    assert learner.device_resident
    next(learner.stream())  # one rollout and update through the Learner's loop
    want = torch.device(device).type
    for t in [env.s, env.gain, env.cut, env.best_cut, env.best_assignment, env.nbr, learner.obs,
              *learner.algo.actor.parameters(), *vars(learner.algo.storage.data).values()]:
        assert t.device.type == want


def test_node_policy_samples_its_own_distribution():
    g = signed_graph(6, seed=10)
    policy = NodePolicy(g.n)
    with torch.no_grad():
        policy.out.weight.mul_(300.0)  # a sharp policy, so a few thousand samples pin it down
    obs = MaxCutEnv(g, 1, seed=0).reset(seed=0)
    logp, _ = policy(obs)
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([policy.act(obs, generator=gen) for _ in range(4000)]).flatten()
    freq = torch.bincount(draws, minlength=g.n).float() / draws.numel()
    assert torch.allclose(freq, logp.exp()[0], atol=0.03)


# ---------------------------------------------------------------------------------- files and generators


def test_gset_reader_reads_1_based_signed_edges(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("4 5 \n1 2 1\n2 3 -1\n% a comment\n3 4 1\n\n4 1 1\n1 3 -1\n")
    g = read_gset(path)
    assert (g.n, g.m, g.name) == (4, 5, "tiny")
    assert g.u.tolist() == [0, 1, 2, 3, 0] and g.v.tolist() == [1, 2, 3, 0, 2]
    assert g.w.tolist() == [1, -1, 1, 1, -1]
    write_gset(g, tmp_path / "again.txt")
    h = read_gset(tmp_path / "again.txt")
    assert torch.equal(h.u, g.u) and torch.equal(h.v, g.v) and torch.equal(h.w, g.w)


@pytest.mark.parametrize("text, match", [
    ("3 2\n1 2 1\n", "header says 2 edges but the file has 1"),
    ("3\n1 2 1\n", "expected a header"),
    ("3 1\n1 x 1\n", r"tiny.txt:2: expected an edge"),
    ("3 1\n1 4 1\n", "node ids"),
    ("3 1\n2 2 1\n", "self loop"),
    ("", "empty graph file"),
])
def test_gset_reader_errors_name_file_and_line(tmp_path, text, match):
    path = tmp_path / "tiny.txt"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        read_gset(path)
    with pytest.raises(UserError, match="does not exist"):
        read_gset(tmp_path / "missing.txt")


def test_generators_are_seeded_and_simple():
    a, b, c = erdos_renyi(40, 0.2, seed=1), erdos_renyi(40, 0.2, seed=1), erdos_renyi(40, 0.2, seed=2)
    assert torch.equal(a.u, b.u) and torch.equal(a.v, b.v) and not torch.equal(a.u, c.u)
    ba = barabasi_albert(50, 3, seed=0)
    assert ba.m == 3 + 3 * (50 - 4)
    pairs = {(min(x, y), max(x, y)) for x, y in zip(ba.u.tolist(), ba.v.tolist())}
    assert len(pairs) == ba.m and all(x != y for x, y in pairs)
    assert torch.equal(ba.u, barabasi_albert(50, 3, seed=0).u)


# ---------------------------------------------------------------------------------- the solver and the CLI


@pytest.mark.parametrize("method", ["ppo", "random", "greedy", "tabu"])
def test_solver_finds_the_optimum_of_a_small_graph(method):
    g = erdos_renyi(16, 0.4, seed=11, weights=(1.0, -1.0))
    best, _ = brute_force_maxcut(g)
    result = solve_maxcut(g, time_limit=2.0, num_envs=8, seed=0, method=method)
    assert result["cut"] == best
    assert cut_value(g, result["assignment"]).item() == best
    assert result["assignment"].dtype == torch.int8 and set(result["assignment"].tolist()) <= {0, 1}


def test_ppo_method_trains_its_policy_and_keeps_the_best_cut():
    g = barabasi_albert(200, 3, seed=5)
    result = solve_maxcut(g, time_limit=6.0, num_envs=8, seed=0, method="ppo")
    assert result["updates"] >= 1 and result["train_seconds"] > 0
    start = result["history"][0][1]  # (seconds, best cut) after the first local search
    assert result["cut"] >= start
    assert cut_value(g, result["assignment"]).item() == result["cut"]


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="corral")
    add_solve_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


def test_cli_json_last_line_and_assignment_file(tmp_path, capsys):
    g = barabasi_albert(40, 2, seed=3)
    write_gset(g, tmp_path / "ba.txt")
    out = tmp_path / "cut.txt"
    code = run_cli(["solve", "maxcut", str(tmp_path / "ba.txt"), "--time-limit", "1", "--envs", "4",
                    "--seed", "1", "--device", "cpu", "--out", str(out), "--json"])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(last)
    assert set(record) == {"cut", "seconds", "nodes", "edges", "method", "time_to_best", "cpu_seconds"}
    assert (record["nodes"], record["edges"]) == (40, g.m)
    sides = read_assignment(out)
    assert sides.shape == (40,) and record["cut"] == cut_value(g, sides).item()
    assert record["cut"] >= g.m / 2  # at least as good as a coin flip on average


def test_cli_bad_input_is_a_user_error(tmp_path):
    write_gset(barabasi_albert(10, 2), tmp_path / "g.txt")
    with pytest.raises(UserError, match="does not exist"):
        run_cli(["solve", "maxcut", str(tmp_path / "nope.txt")])
    with pytest.raises(UserError, match="time-limit"):
        run_cli(["solve", "maxcut", str(tmp_path / "g.txt"), "--time-limit", "0"])
    with pytest.raises(UserError, match="unknown problem"):
        run_cli(["solve", "tsp", str(tmp_path / "g.txt")])
    with pytest.raises(UserError, match="envs"):
        run_cli(["solve", "maxcut", str(tmp_path / "g.txt"), "--envs", "0"])
