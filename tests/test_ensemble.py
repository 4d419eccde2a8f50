"""Ensembles and model fusion (corral.population.ensemble, `corral ensemble`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import corral
from corral.actors.normalizer import RunningNormalizer
from corral.cli import main
from corral.errors import UserError
from corral.population.ensemble import Ensemble, fuse, pooled_statistics, weights_from_returns

EPISODES = 10


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Three short PPO runs on CartPole (different seeds, observation normalization on): members
    of unequal quality, as an ensemble meets them."""
    root = tmp_path_factory.mktemp("members")
    out = []
    for seed in (0, 1, 2):
        agent = corral.train("ppo", "CartPole-v1", steps=12_288, seed=seed, run_dir=str(root / f"s{seed}"),
                             **{"ppo.normalize_obs": True, "eval.episodes": 0, "tensorboard": False})
        out.append(agent)
    return out


def _eval(agent) -> float:
    return corral.evaluate(agent, "CartPole-v1", episodes=EPISODES, seed=123, num_envs=5)["mean_return"]


def test_eval_weighted_ensemble_of_three_cartpole_agents_beats_their_mean_member(members, tmp_path):
    returns = [_eval(m) for m in members]
    by_eval = Ensemble(members, weights=weights_from_returns(returns))
    equal = Ensemble(members)
    r_eval, r_equal = _eval(by_eval), _eval(equal)
    # Measured (seeds 0-2, 12,288 steps each): members [475.4, 211.0, 159.0], eval-weighted 458.9,
    # equal weights 216.0: with members this unequal an equal vote follows the two weak ones.
    print(f"members {returns}, eval-weighted ensemble {r_eval} (weights {by_eval.weights}), equal {r_equal}")
    assert r_eval >= np.mean(returns)
    assert int(np.argmax(by_eval.weights)) == int(np.argmax(returns))
    # saved as one agent, loaded back by corral.load as the same ensemble
    back = corral.load(by_eval.save(tmp_path / "ens.pt"), device="cpu")
    assert isinstance(back, Ensemble) and back.weights == pytest.approx(by_eval.weights)
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    assert np.array_equal(back.act(obs), by_eval.act(obs))


def test_ensemble_acts_on_the_weighted_mean_of_member_probabilities(members):
    w = [0.5, 0.3, 0.2]
    ens = Ensemble(members, weights=[5, 3, 2])  # normalized
    assert ens.weights == pytest.approx(w)
    obs = torch.as_tensor(np.random.default_rng(1).normal(size=(64, 4)), dtype=torch.float32)
    probs = [m.actor.dist_params(m.actor.normalize(obs)).exp() for m in members]
    mean = sum(wi * p for wi, p in zip(w, probs))
    assert torch.allclose(ens.algo.scores(obs), mean, atol=1e-6)
    assert torch.equal(ens.algo.act(obs), mean.argmax(-1))


def test_fusion_of_identical_members_is_exact(members, tmp_path):
    a = members[0]
    fused = fuse([a, a, a], weights=[0.2, 0.5, 0.3])
    for (name, p), (_, q) in zip(a.actor.named_parameters(), fused.actor.named_parameters()):
        assert torch.equal(p, q), name
    norm_a, norm_f = a.actor.obs_norm, fused.actor.obs_norm
    assert norm_a.count > 0
    assert torch.equal(norm_a.mean, norm_f.mean) and torch.equal(norm_a.var, norm_f.var)
    assert float(norm_f.count) == 3 * float(norm_a.count)  # pooled: all the members' samples
    obs = np.random.default_rng(2).normal(size=(512, 4)).astype(np.float32) * 2
    assert np.array_equal(fused.act(obs), a.act(obs))
    back = corral.load(fused.save(tmp_path / "fused.pt"), device="cpu")
    assert np.array_equal(back.act(obs), a.act(obs))


def test_fusion_averages_parameters_with_the_weights(members):
    w = [0.6, 0.3, 0.1]
    fused = fuse(members, weights=w)
    for name, p in fused.actor.named_parameters():
        want = sum(wi * dict(m.actor.named_parameters())[name] for wi, m in zip(w, members))
        assert torch.allclose(p, want, atol=1e-6), name


def test_pooled_statistics_equal_one_normalizer_that_saw_every_sample():
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(n, 3, generator=g) * s + m for n, s, m in ((50, 1.0, 0.0), (200, 3.0, 2.0), (7, 0.5, -4.0))]
    norms = []
    for c in chunks:
        n = RunningNormalizer((3,))
        for part in c.split(16):
            n.update(part)
        norms.append(n)
    count, mean, var = pooled_statistics([n.count for n in norms], [n.mean for n in norms], [n.var for n in norms])
    one = RunningNormalizer((3,))
    one.update(torch.cat(chunks))
    assert float(count) == 257
    assert torch.allclose(mean, one.mean, atol=1e-10) and torch.allclose(var, one.var, atol=1e-10)


def test_fusion_and_ensembles_refuse_mismatched_members(members, tmp_path):
    small = corral.train("ppo", "CartPole-v1", steps=256, seed=0, save_run=False,
                         **{"ppo.hidden": (32, 32), "ppo.n_steps": 64, "eval.episodes": 0})
    with pytest.raises(UserError, match=r"one architecture.*shape"):
        fuse([members[0], small])
    dqn = corral.train("dqn", "CartPole-v1", steps=200, seed=0, save_run=False,
                       **{"dqn.learning_starts": 100, "eval.episodes": 0})
    with pytest.raises(UserError, match="is dqn, member 0 is ppo"):
        fuse([members[0], dqn])
    with pytest.raises(UserError, match="votes with q, member 0 with probs"):
        Ensemble([members[0], dqn])
    pend = corral.train("ppo", "Pendulum-v1", steps=256, seed=0, save_run=False,
                        **{"ppo.n_steps": 64, "eval.episodes": 0})
    with pytest.raises(UserError, match="members must share one env"):
        Ensemble([members[0], pend])
    with pytest.raises(UserError, match="one per member"):
        Ensemble(members, weights=[1, 2])
    with pytest.raises(UserError, match="at least 2"):
        Ensemble(members[:1])


def test_q_value_ensemble_takes_the_argmax_of_the_weighted_mean_q():
    agents = [corral.train("dqn", "CartPole-v1", steps=300, seed=s, save_run=False,
                           **{"dqn.learning_starts": 100, "eval.episodes": 0}) for s in (0, 1)]
    ens = Ensemble(agents, weights=[1, 3])
    obs = torch.as_tensor(np.random.default_rng(3).normal(size=(128, 4)), dtype=torch.float32)
    q = 0.25 * agents[0].algo.actor.q(obs) + 0.75 * agents[1].algo.actor.q(obs)
    assert ens.algo.value_method
    assert torch.equal(ens.algo.act(obs), q.argmax(-1))


def test_weights_from_returns_favour_the_better_members():
    w = weights_from_returns([100.0, 300.0, 500.0])
    assert w == pytest.approx([40 / 720, 240 / 720, 440 / 720]) and abs(sum(w) - 1) < 1e-12
    assert weights_from_returns([5.0, 5.0]) == [0.5, 0.5]


def test_cli_ensemble_and_fuse(members, tmp_path, capsys):
    runs = [str(m.run_dir) for m in members]
    assert main(["ensemble", *runs, "--weights", "eval", "--episodes", "2", "--out", str(tmp_path / "e.pt"),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["kind"] == "ensemble" and len(out["members"]) == 3 and abs(sum(out["weights"]) - 1) < 1e-6
    assert isinstance(corral.load(tmp_path / "e.pt"), Ensemble)
    assert main(["ensemble", *runs, "--fuse", "--episodes", "2", "--out", str(tmp_path / "f.pt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kind"] == "fused"
    assert main(["eval", str(tmp_path / "f.pt"), "--episodes", "2", "--quiet", "--json"]) == 0
    assert main(["ensemble", *runs, "--weights", "1,x"]) == 2
