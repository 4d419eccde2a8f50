"""QMIX and VDN: the QMIX paper's two-step game (known answers), the mixer's monotonicity,
absent agents, gradient isolation, exact resume and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("pettingzoo")

from envs_for_tests import trained_and_resumed  # noqa: E402

from corral.algos.qmix import QMixer  # noqa: E402
from corral.cli import main  # noqa: E402
from corral.storage.replay import ReplayBatch  # noqa: E402
from corral.train.learner import Learner  # noqa: E402
from corral.train.setup import build_config  # noqa: E402

GAME = "corral.envs.matrix_games:TwoStepGame"
QUIET = ["progress=false", "tensorboard=false"]


def game_config(algo, steps, eps_final, seed=0, more=()):
    return build_config(algo, GAME, steps=steps, seed=seed, sets=[*QUIET, "env.num_envs=16", "eval.episodes=4",
                        f"{algo}.learning_starts=500", f"{algo}.batch_size=64", f"{algo}.target_update_interval=800",
                        f"{algo}.buffer_size=6000", f"{algo}.gradient_steps=4", f"{algo}.lr=0.001",
                        f"{algo}.exploration_final_eps={eps_final}", *more])


def q_tot_table(algo, state: int) -> torch.Tensor:
    """Q_tot of the four joint actions in state 0 (first step), 1 (2A) or 2 (2B)."""
    L = algo.layout
    x = torch.zeros(1, L.size)
    for j in range(2):
        x[0, j * 3 + state] = 1.0
    x[0, L.state_start + state] = 1.0
    x[0, L.mask_start:] = 1.0  # both agents present, every action valid
    with torch.no_grad():
        q = algo.actor.q(x)[0]
        joint = torch.stack([torch.stack([q[0, i], q[1, j]]) for i in range(2) for j in range(2)])
        return algo.mixer(joint, x[:, L.state_start:L.mask_start].expand(4, -1)).view(2, 2)


@pytest.mark.parametrize("algo,ret,table_2b,shared", [
    ("qmix", 8.0, [[0.0, 1.0], [1.0, 8.0]], True),  # QMIX represents the payoff exactly
    ("vdn", 7.0, [[-1.5, 2.5], [2.5, 6.5]], True),  # VDN: the additive least-squares fit under uniform data
    # the same with one Q-network per agent (slow: ~1.3x the shared run; the CI budget)
    pytest.param("qmix", 8.0, [[0.0, 1.0], [1.0, 8.0]], False, marks=pytest.mark.slow),
])
def test_two_step_game_under_full_exploration_gives_the_papers_answers(algo, ret, table_2b, shared):
    """Rashid et al. 2018, Table 1: trained under full exploration (epsilon 1), QMIX's greedy
    policy takes the optimum 8 (go to 2B, both play 1) and VDN's takes 7 (2A): its sum of
    per-agent values can only fit 2B's payoff additively, and that fit's best is 6.5."""
    learner = Learner(game_config(algo, 6000, 1.0, more=[f"{algo}.exploration_initial_eps=1.0",
                                                          f"{algo}.share_params={str(shared).lower()}"]), None)
    summary = learner.train()
    assert summary["eval_return"] == ret
    algo_ = learner.algo
    assert torch.allclose(q_tot_table(algo_, 2), torch.tensor(table_2b), atol=0.3), q_tot_table(algo_, 2)
    assert torch.allclose(q_tot_table(algo_, 1), torch.full((2, 2), 7.0), atol=0.3)
    first = q_tot_table(algo_, 0)
    if algo == "qmix":  # the first step: agent 1's action does nothing; 0.99 * 8 beats 0.99 * 7
        assert torch.allclose(first, torch.tensor([[6.93, 6.93], [7.92, 7.92]]), atol=0.3)
    else:
        assert first[0].max() > first[1].max()


@pytest.mark.slow
def test_qmix_reaches_the_optimum_with_decaying_exploration():
    summary = Learner(game_config("qmix", 8000, 0.05, seed=1, more=["qmix.exploration_fraction=0.5"]), None).train()
    assert summary["eval_return"] >= 7.5


def test_mixing_weights_are_non_negative_and_q_tot_is_monotone_in_each_agents_q():
    torch.manual_seed(0)
    mixer = QMixer(3, 5, embed=8, hyper_hidden=16)
    state = torch.randn(64, 5) * 3
    w1, w2 = mixer.weights(state)
    assert (w1 >= 0).all() and (w2 >= 0).all()
    assert (mixer.hyper_w1(state) < 0).any()  # the raw hypernetwork outputs are not: abs makes them so
    q = (torch.randn(64, 3) * 5).requires_grad_(True)
    mixer(q, state).sum().backward()
    assert (q.grad >= 0).all() and (q.grad > 0).any()
    # raising one agent's Q never lowers Q_tot
    with torch.no_grad():
        base = mixer(q, state)
        for a in range(3):
            up = q.clone()
            up[:, a] += torch.rand(64) * 4
            assert (mixer(up, state) >= base - 1e-5).all()


def leaving_learner(algo="qmix", steps=400, seed=0, sets=()):
    return Learner(build_config(algo, "tests/ma_envs.py:LeavingEnv", steps=steps, seed=seed, sets=[
        *QUIET, "eval.episodes=0", "env.num_envs=2", f"{algo}.learning_starts=60", f"{algo}.batch_size=16",
        f"{algo}.hidden=[16]", f"{algo}.target_update_interval=40", *sets]), None)


def test_absent_agents_add_nothing_to_the_loss_and_training_runs_with_a_leaver():
    lr = leaving_learner()
    summary = lr.train()
    assert summary["env_steps"] == 400 and lr.algo.grad_steps > 100
    algo = lr.algo
    batch = algo.replay.sample(64)
    L = algo.layout
    absent = ~L.split(batch.obs).agent_mask
    assert absent.any() and absent.all(0).tolist() == [False, False, False]

    def loss(b):
        gen = algo.phases(b, {})
        _, value = next(gen)
        return value.detach()

    garbage = batch.obs.clone()
    obs_view = garbage[:, :L.state_start].view(-1, L.n_agents, L.obs_dim)
    obs_view[absent] = 77.0  # an absent agent's observation slot (not the state) filled with garbage
    changed = ReplayBatch(**{**batch.__dict__, "obs": garbage})
    assert torch.equal(loss(batch), loss(changed))
    # the same garbage in a present agent's slot changes it (the test can fail)
    obs_view2 = batch.obs.clone()[:, :L.state_start].view(-1, L.n_agents, L.obs_dim)
    full = batch.obs.clone()
    full[:, :L.state_start] = obs_view2.masked_fill(~absent.unsqueeze(-1), 77.0).view(full.shape[0], -1)
    assert not torch.equal(loss(batch), loss(ReplayBatch(**{**batch.__dict__, "obs": full})))


def test_the_loss_moves_the_agents_and_the_mixer_not_the_targets():
    lr = leaving_learner(steps=100)
    lr.train()
    algo = lr.algo
    before = {n: [p.clone() for p in getattr(algo, n).parameters()] for n in algo.networks}
    batch = algo.replay.sample(32)
    algo.train_step(batch)
    moved = {n: any(not torch.equal(a, b) for a, b in zip(before[n], getattr(algo, n).parameters()))
             for n in algo.networks}
    assert moved == {"actor": True, "mixer": True, "target": False, "target_mixer": False}


def test_per_agent_q_networks_agent_is_q_moves_only_agent_is_weights():
    lr = leaving_learner(steps=80, sets=["qmix.share_params=false"])
    lr.train()
    algo = lr.algo
    assert algo.actor.net.net.weights[0].shape[:2] == (3, 16)  # [agents, hidden, obs] (no agent id input)
    batch = algo.replay.sample(32)
    q = algo.actor.q(batch.obs)
    for i in range(3):
        algo.actor.zero_grad()
        q[:, i].masked_fill(q[:, i].isinf(), 0.0).sum().backward(retain_graph=True)
        for p in [*algo.actor.net.net.weights, *algo.actor.net.net.biases]:
            assert (p.grad.flatten(1).abs().sum(1) > 0).tolist() == [a == i for a in range(3)]


def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    sets = [*QUIET, "eval.episodes=0", "env.num_envs=4", "qmix.learning_starts=40", "qmix.batch_size=16",
            "qmix.target_update_interval=64", "qmix.hidden=[16]", "qmix.exploration_fraction=0"]
    a, b = trained_and_resumed("qmix", GAME, sets, n=200, seed=3, run_dir=tmp_path / "b")
    for name in ("actor", "mixer", "target", "target_mixer"):
        for (k, pa), pb in zip(getattr(a.algo, name).state_dict().items(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), (name, k)
    assert a.algo.grad_steps > 80


def test_cli_trains_qmix_on_mpe(tmp_path, capsys):
    pytest.importorskip("mpe2")
    for algo in ("qmix",):
        assert main(["train", algo, "mpe:simple_spread_v3", "--steps", "200", "--run-dir", str(tmp_path / algo),
                     "--json", "--set", "env.num_envs=2", "--set", f"{algo}.learning_starts=100",
                     "--set", f"{algo}.batch_size=16", "--set", "eval.episodes=2", "--set", "progress=false"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["env_steps"] == 200 and len(summary["eval"]["agent_returns"]) == 3
        rows = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
        assert any("q_loss" in r for r in rows)


# --- recurrent agents on sequence replay (qmix.recurrent=true)

def recurrent_config(algo, steps, seed=0, more=()):
    return game_config(algo, steps, 1.0, seed=seed, more=[
        f"{algo}.exploration_initial_eps=1.0", f"{algo}.recurrent=true", f"{algo}.seq_len=4", f"{algo}.batch_size=16",
        f"{algo}.core_size=32", *more])


def test_recurrent_agents_carry_their_state_along_a_sequence_and_reset_it_at_episode_starts():
    from corral.algos.qmix import RecurrentQMIX

    algo = Learner(recurrent_config("qmix", 100), None).algo
    assert isinstance(algo, RecurrentQMIX) and algo.recurrent
    net, L = algo.actor, algo.layout
    torch.manual_seed(0)
    T, B = 5, 3
    obs = torch.zeros(T, B, L.size)
    obs[..., :L.state_start] = torch.randn(T, B, L.state_start)
    obs[..., L.state_start:L.mask_start] = torch.randn(T, B, L.mask_start - L.state_start)
    obs[..., L.mask_start:] = 1.0
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[0] = True
    starts[3, 1] = True  # column 1's second episode starts at step 3
    state0 = torch.randn(B, net.state_dim)  # ignored where step 0 starts an episode
    with torch.no_grad():
        q, last = net.q_sequence(obs, state0, starts)
        # step by step, one GRU step at a time: the same
        s = state0
        for t in range(T):
            qt, s = net.q_step(obs[t], s, starts[t])
            assert torch.allclose(q[t], qt, atol=1e-5)
        assert torch.allclose(last, s, atol=1e-6)
        # column 1 from step 3 equals a fresh sequence from step 3 (the state was reset there) ...
        fresh, _ = net.q_sequence(obs[3:, 1:2], torch.randn(1, net.state_dim), torch.ones(2, 1, dtype=torch.bool))
        assert torch.allclose(q[3, 1], fresh[0, 0], atol=1e-5)
        # ... and column 0's step 3 does not (its state carries steps 0-2)
        cold, _ = net.q_sequence(obs[3:4, 0:1], net.initial_state(1), torch.ones(1, 1, dtype=torch.bool))
        assert not torch.allclose(q[3, 0], cold[0, 0], atol=1e-3)
    # the joint action index round-trips
    u = torch.tensor([[0, 1], [1, 1], [1, 0]])
    assert algo.encode(u).tolist() == [2, 3, 1] and torch.equal(algo.decode(algo.encode(u)), u)


@pytest.mark.slow
def test_recurrent_qmix_reaches_the_two_step_games_optimum():
    """The paper's GRU agents on sequence replay (4-step sequences across the 2-step episodes,
    starts marking the resets) still learn the optimum 8 under full exploration."""
    learner = Learner(recurrent_config("qmix", 6000), None)
    summary = learner.train()
    assert learner.algo.grad_steps > 500
    assert summary["eval_return"] == 8.0


def test_recurrent_qmix_resumes_bit_for_bit(tmp_path):
    sets = [*QUIET, "eval.episodes=0", "env.num_envs=4", "qmix.learning_starts=40", "qmix.batch_size=8",
            "qmix.target_update_interval=64", "qmix.hidden=[16]", "qmix.recurrent=true", "qmix.seq_len=3",
            "qmix.core_size=8", "qmix.exploration_fraction=0"]
    a, b = trained_and_resumed("qmix", GAME, sets, n=120, seed=3, run_dir=tmp_path / "b")
    for name in ("actor", "mixer", "target", "target_mixer"):
        for (k, pa), pb in zip(getattr(a.algo, name).state_dict().items(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), (name, k)
    assert a.algo.grad_steps > 40 and torch.equal(a.algo._state, b.algo._state)
