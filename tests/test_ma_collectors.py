"""Collectors for the on-policy multi-agent algorithms (mappo, ippo): fragments carry the
per-agent results, every agent column bootstraps at a fragment's boundary, a distributed run
resumed from its checkpoint equals one that never stopped, and learning with collectors.

Tests named ``*_in_process`` run the collectors in this process (``LocalPool``, no Ray)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pettingzoo")

from corral.schemes.collector import Collector, driver_paths  # noqa: E402
from corral.schemes.fragments import FragmentScheme  # noqa: E402
from corral.train.checkpoint import load_checkpoint  # noqa: E402
from corral.train.learner import Learner  # noqa: E402
from corral.train.setup import build_config, new_run_dir  # noqa: E402

LEAVING = "tests/ma_envs.py:LeavingEnv"
QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def learner(algo="mappo", steps=96, run_dir=None, **overrides):
    over = {**QUIET, "env.num_envs": 2, f"{algo}.n_steps": 8, f"{algo}.hidden": [16, 16], **overrides}
    cfg = build_config(algo, LEAVING, steps=steps, overrides=over)
    return Learner(cfg, new_run_dir(cfg, str(run_dir)) if run_dir else None, env_spec=LEAVING, quiet=True)


def run_in_process(L):
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    return scheme, L.train()


def test_fragments_carry_agent_results_and_every_agent_column_bootstraps_at_the_boundary_in_process():
    L = learner(**{"scheme.collectors": 2})
    FragmentScheme(L).setup_learner()
    assert L.algo.cfg.n_steps == 16 and L.algo.num_envs == 2 * 3  # two fragments of 8 steps, 2 envs x 3 agents
    c = Collector(L.cfg, LEAVING, 0, 2, paths=driver_paths())
    _, data = c.collect(None, 0)
    T, N, A = 8, 2, 3
    assert data.agents.reward.shape == data.agents.terminated.shape == (T, N, A)
    algo = L.algo
    for step in data.steps():
        algo.observe(step)
    rows = algo.storage.data
    present = algo.present[:T].reshape(T, N, A)
    view = algo.layout.split(data.obs[:T])
    assert torch.equal(present, view.agent_mask)
    assert torch.equal(rows.rewards[:T].reshape(T, N, A), data.agents.reward)
    term = rows.terminated[:T].reshape(T, N, A)
    trunc = rows.truncated[:T].reshape(T, N, A)
    assert torch.equal(term, data.agents.terminated | ~present)
    # inside the fragment the env's own per-agent truncations; at its last step every present column
    assert torch.equal(trunc[:-1], data.agents.truncated[:-1] & present[:-1])
    assert torch.equal(trunc[-1], present[-1])
    assert not data.agents.truncated[-1].all()  # (the boundary is not an env truncation: the test can fail)
    # the boundary's final rows are the agents' rows of the next observation: V(obs[T]) is bootstrapped
    nxt, _ = algo.actor.columns(data.obs[T])
    assert torch.equal(rows.final_obs[T - 1], nxt)
    c.close()


def test_a_distributed_mappo_run_resumed_from_its_checkpoint_equals_one_that_never_stopped_in_process(tmp_path):
    over = {"scheme.collectors": 2, "checkpoint.every": 10**9, "mappo.share_params": False}
    n = 2 * 2 * 8 * 3  # three updates of two fragments

    def params(L):
        return torch.cat([p.detach().flatten() for p in L.algo.actor.parameters()])

    full = learner(steps=2 * n, run_dir=tmp_path / "full", **over)
    run_in_process(full)
    half = learner(steps=n, run_dir=tmp_path / "half", **over)
    run_in_process(half)
    state = load_checkpoint(tmp_path / "half" / "checkpoints" / "latest.pt")
    assert len(state["collectors"]) == 2 and all(c["env"] is not None for c in state["collectors"])
    rest = learner(steps=2 * n, run_dir=tmp_path / "rest", **over)
    rest.load_state_dict(state)
    run_in_process(rest)
    assert rest.env_steps == full.env_steps == 2 * n and full.algo.updates == 6
    assert torch.equal(params(rest), params(full))
    assert rest.episodes == full.episodes and list(rest.recent_returns) == list(full.recent_returns)


@pytest.mark.slow
def test_ippo_with_two_collectors_learns_the_leaving_game_in_process():
    """The leaving game (tests/ma_envs.py; random team ~2.8 of 6), two in-process collectors of
    2 envs each: a held-out deterministic evaluation (20 episodes, other seeds) reaches 5.5."""
    cfg = build_config("ippo", LEAVING, steps=6000, seed=1, overrides={
        "progress": False, "tensorboard": False, "env.num_envs": 2, "ippo.n_steps": 24, "ippo.hidden": [32, 32],
        "ippo.lr": 0.003, "eval.episodes": 20, "scheme.collectors": 2})
    L = Learner(cfg, None, env_spec=LEAVING, quiet=True)
    _, summary = run_in_process(L)
    assert summary["env_steps"] == 6000 and summary["eval_return"] >= 5.5, summary["eval"]


def test_mappo_with_two_ray_collectors_learns_the_leaving_game(ray_local):
    """The same game with two Ray collectors (separate processes; the run is the same whatever
    order their fragments arrive in only up to that order, so the bar has a margin)."""
    cfg = build_config("mappo", LEAVING, steps=6000, seed=2, overrides={
        "progress": False, "tensorboard": False, "env.num_envs": 2, "mappo.n_steps": 24, "mappo.hidden": [32, 32],
        "mappo.lr": 0.003, "eval.episodes": 20, "scheme.collectors": 2})
    summary = Learner(cfg, None, env_spec=LEAVING, quiet=True).train()
    assert summary["env_steps"] == 6000 and summary["eval_return"] >= 5.5, summary["eval"]
