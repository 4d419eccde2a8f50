"""Population-based training (corral.population.pbt, corral.population.trainable)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from corral.population.pbt import exploit, explore, toy
from corral.population.space import Dim, parse_space


@pytest.mark.parametrize("seed", range(8))
def test_pbt_toy_reaches_the_optimum_with_exploit_and_explore_and_not_with_either_alone(seed):
    """The paper's toy (Jaderberg et al. 2017, section 4): Q(theta) = 1.2 - |theta|^2 seen only
    through Q_hat(theta | h). Exploit alone keeps h = [1, 1e-3]-like values (one coordinate
    barely moves); explore alone drifts h without selection; together selection carries the
    members whose small h entry grew."""
    both = toy(steps=400, seed=seed)
    assert both["final"] >= 1.2 - 1e-3 and both["reached"] is not None
    for use_exploit, use_explore in ((True, False), (False, True), (False, False)):
        alone = toy(steps=400, seed=seed, use_exploit=use_exploit, use_explore=use_explore)
        assert alone["final"] < 1.0 and alone["reached"] is None, (use_exploit, use_explore, alone["final"])


def test_explore_perturbs_by_the_factors_within_bounds_or_resamples():
    space = parse_space(["ppo.lr=loguniform:1e-4:1e-2", "ppo.n_epochs=choice:4,10,20", "ppo.gamma=uniform:0.9:0.999"])
    rng = random.Random(0)
    for _ in range(50):
        new = explore({"ppo.lr": 1e-3, "ppo.n_epochs": 10, "ppo.gamma": 0.99, "other": 7}, space, rng,
                      resample_probability=0.0)
        assert new["ppo.lr"] == pytest.approx(8e-4) or new["ppo.lr"] == pytest.approx(1.2e-3)
        assert new["ppo.n_epochs"] in (4, 20)
        assert new["ppo.gamma"] in (pytest.approx(0.999), pytest.approx(0.9))  # 0.99 x 1.2 or x 0.8, clipped
        assert new["other"] == 7
    edge = explore({"ppo.lr": 1e-2}, {"ppo.lr": space["ppo.lr"]}, random.Random(1), resample_probability=0.0)
    assert edge["ppo.lr"] <= 1e-2  # clipped to the bound
    drawn = [explore({"ppo.lr": 1e-3}, {"ppo.lr": space["ppo.lr"]}, rng, resample_probability=1.0)["ppo.lr"]
             for _ in range(200)]
    assert all(1e-4 <= x <= 1e-2 for x in drawn) and len(set(drawn)) == 200


def test_exploit_pairs_the_bottom_quantile_with_the_top():
    pairs = exploit([5.0, 1.0, 9.0, 3.0, 7.0, 8.0, 2.0, 6.0], random.Random(0), quantile=0.25)
    assert sorted(p[0] for p in pairs) == [1, 6]
    assert all(w in (2, 5) for _, w in pairs)


def _trainable(tmp_path, name, algo, hparams, sets, steps_per_iteration=512, iterations=8):
    from corral.population.trainable import CorralTrainable
    from corral.population.tune import trainable_params

    base = trainable_params(algo, "CartPole-v1", ["tensorboard=false", *sets], 0, steps_per_iteration, iterations, 2,
                            tmp_path / name)
    return CorralTrainable(config={**base, **hparams})


def test_exploit_restores_the_winners_state_with_the_explored_hyper_parameters_in_effect(tmp_path):
    sets = ["ppo.n_steps=64", "ppo.normalize_obs=true", "ppo.lr_schedule=constant", "log_every=256"]
    winner = _trainable(tmp_path, "winner", "ppo", {"ppo.lr": 1e-3, "ppo.ent_coef": 0.0}, sets)
    winner.train()
    ckpt = winner.save(str(tmp_path / "ckpt"))
    loser = _trainable(tmp_path, "loser", "ppo", {"ppo.lr": 3.7e-4, "ppo.ent_coef": 0.01}, sets)
    loser.restore(ckpt)
    w, l_ = winner.learner, loser.learner
    # the winner's state: weights, normalizer, optimizer moments, counters
    for (name, p), (_, q) in zip(w.algo.actor.state_dict().items(), l_.algo.actor.state_dict().items()):
        assert torch.equal(p, q), name
    assert float(l_.algo.actor.obs_norm.count) > 0
    assert torch.equal(w.algo.optimizer.exp_avg, l_.algo.optimizer.exp_avg)
    assert l_.env_steps == w.env_steps == 512
    # the explored values, read back from the restored algorithm
    assert l_.algo.optimizer.lr == 3.7e-4 and w.algo.optimizer.lr == 1e-3
    assert l_.algo.cfg.lr == 3.7e-4 and l_.algo.cfg.ent_coef == 0.01
    result = loser.train()
    assert result["hp/ppo.lr"] == 3.7e-4 and result["env_steps"] == 1024
    rows = [json.loads(x) for x in (loser.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if "lr" in r][-1] == pytest.approx(3.7e-4)  # the updates used it
    assert loser.learner.algo.optimizer.lr == 3.7e-4
    winner.stop()
    loser.stop()


def test_exploit_copies_the_replay_buffer_of_an_off_policy_member(tmp_path):
    sets = ["dqn.learning_starts=100", "dqn.buffer_size=2000"]
    winner = _trainable(tmp_path, "w", "dqn", {"dqn.lr": 1e-3}, sets, steps_per_iteration=300)
    winner.train()
    ckpt = winner.save(str(tmp_path / "ckpt"))
    loser = _trainable(tmp_path, "l", "dqn", {"dqn.lr": 2e-4}, sets, steps_per_iteration=300)
    loser.restore(ckpt)
    ws, ls = winner.learner.algo.replay.state_dict(), loser.learner.algo.replay.state_dict()
    assert ws.keys() == ls.keys()
    for k in ws:
        if torch.is_tensor(ws[k]):
            assert torch.equal(ws[k], ls[k]), k
    assert loser.learner.algo.optimizer.lr == 2e-4 and loser.learner.algo.cfg.lr == 2e-4
    winner.stop()
    loser.stop()


def test_space_errors_name_the_key_and_the_fix():
    from corral.errors import UserError
    from corral.population.tune import check_space

    with pytest.raises(UserError, match="LOW < HIGH"):
        parse_space(["ppo.lr=loguniform:1e-2:1e-4"])
    with pytest.raises(UserError, match="KEY=KIND:ARGS"):
        parse_space(["ppo.lr"])
    with pytest.raises(UserError, match="one of loguniform"):
        parse_space(["ppo.lr=normal:0:1"])
    with pytest.raises(UserError, match="ppo.lrr"):
        check_space(parse_space(["ppo.lrr=loguniform:1e-4:1e-2"]), "ppo", "CartPole-v1")
    assert Dim("k", "randint", 32, 256).to_tune().upper == 257  # Tune's randint excludes its upper bound


@pytest.mark.slow
def test_pbt_on_cartpole_ppo_drops_the_bad_learning_rates_and_solves_it(tmp_path):
    """A population of 4 PPO members on CartPole-v1 started at lr 1e-5, 3e-5 (far too small for
    this budget), 1e-3 and 3e-3; PBT (Ray Tune's scheduler, exploit every iteration, explore by
    perturbation) ends with every member at lr >= 1e-4 and its best member >= 475 on a held-out
    deterministic evaluation."""
    import corral
    from corral.population.pbt import pbt

    r = pbt("ppo", "CartPole-v1", mutations={"ppo.lr": "loguniform:1e-5:1e-2"},
            initial={"ppo.lr": [1e-5, 3e-5, 1e-3, 3e-3]}, population=4, iterations=12, steps_per_iteration=10_000,
            quantile=0.25, resample_probability=0.0, sets=["tensorboard=false"], eval_episodes=10,
            out=tmp_path / "pbt", num_cpus=2, cpus_per_trial=0.5, seed=0)
    final_lrs = sorted(m["ppo.lr"] for m in r["final"])
    print("final population:", r["final"])
    assert len(final_lrs) == 4 and min(final_lrs) >= 1e-4, final_lrs
    best_dir = tmp_path / "pbt" / "runs" / r["best"]["trial"]
    held_out = corral.evaluate(corral.load(best_dir / "checkpoints" / "latest.pt"), episodes=20, seed=12345)
    print("best member", r["best"], "held-out", held_out["mean_return"])
    assert held_out["mean_return"] >= 475
    assert (tmp_path / "pbt" / "schedules.csv").is_file() and (tmp_path / "pbt" / "schedules.png").is_file()
