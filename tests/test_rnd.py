"""RND (corral.exploration.rnd) and ppo_rnd (corral.algos.ppo_rnd): known answers of RND's
parts, gradient isolation, exact resume, collectors, a CLI run, MontezumaRevenge through the
loop, and learning MountainCar-v0 where PPO does not."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs_for_tests import ppo_at_the_settings_of

import corral
from corral.algos.base import Step
from corral.algos.ppo_rnd import PPORND, PPORNDConfig
from corral.cli import main
from corral.errors import UserError
from corral.exploration import RND, IntrinsicReturnNormalizer
from corral.rng import RNGStreams
from corral.train.checkpoint import load_checkpoint
from corral.train.learner import Learner
from corral.train.setup import build_config

FLAT = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
PIXELS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


# --- the RND module ---------------------------------------------------------------------

def mixed_envs_forward_filter(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """CleanRL's ppo_rnd_envpool.py: the filter is fed ``rewards.T`` ([N, T]), so each of its
    "steps" is one env's whole rollout and the running value carries from env to env."""
    rewems, out = None, []
    for row in rewards.T:
        rewems = row.clone() if rewems is None else rewems * gamma + row
        out.append(rewems)
    return torch.stack(out)


def test_intrinsic_returns_run_along_time_per_env_on_a_hand_worked_example():
    # 2 envs, 3 steps, gamma 0.5; env 0 gets 1, 0, 2 and env 1 gets 4, 4, 0
    r = torch.tensor([[1.0, 4.0], [0.0, 4.0], [2.0, 0.0]])
    norm = IntrinsicReturnNormalizer(2, gamma=0.5)
    R = norm.forward_filter(r)
    # env 0: 1, 0.5*1+0 = 0.5, 0.5*0.5+2 = 2.25; env 1: 4, 2+4 = 6, 3+0 = 3
    torch.testing.assert_close(R, torch.tensor([[1.0, 4.0], [0.5, 6.0], [2.25, 3.0]]))
    norm.update(R)
    values = np.array([1.0, 0.5, 2.25, 4.0, 6.0, 3.0])
    assert norm.stats.count.item() == 6
    np.testing.assert_allclose(norm.std.item(), np.sqrt(values.var() + 1e-8), rtol=1e-6)
    torch.testing.assert_close(norm.normalize(torch.tensor([2.0])), torch.tensor([2.0]) / norm.std)
    # the filter carries on from where the rollout ended, per env
    torch.testing.assert_close(norm.step(torch.tensor([1.0, 0.0])), torch.tensor([2.125, 1.5]))

    # the env-mixing variant: "steps" are env rows [1, 0, 2] then 0.5*[1, 0, 2] + [4, 4, 0]
    mixed = mixed_envs_forward_filter(r, 0.5)
    torch.testing.assert_close(mixed, torch.tensor([[1.0, 0.0, 2.0], [4.5, 4.0, 1.0]]))
    wrong = np.array([1.0, 0.0, 2.0, 4.5, 4.0, 1.0])
    assert abs(np.sqrt(wrong.var()) - np.sqrt(values.var())) > 0.1  # a different, wrong scale


def test_intrinsic_return_normalizer_state_round_trips():
    a = IntrinsicReturnNormalizer(3, 0.9)
    a.update(a.forward_filter(torch.rand(5, 3, generator=torch.Generator().manual_seed(0))))
    b = IntrinsicReturnNormalizer(3, 0.9)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.ret, b.ret) and torch.equal(a.std, b.std)


def test_observation_normaliser_clips_to_plus_minus_clip():
    rnd = RND(FLAT, clip=5.0)
    rnd.update_obs_norm(torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]))  # mean 1, std 1
    x = rnd.prepare(torch.tensor([[1.0, 100.0, -100.0], [3.0, 4.0, -1.0]]))
    torch.testing.assert_close(x, torch.tensor([[0.0, 5.0, -5.0], [2.0, 3.0, -2.0]]), rtol=0, atol=1e-6)
    rnd.eval()  # no statistics move in eval mode
    rnd.update_obs_norm(torch.full((4, 3), 50.0))
    assert rnd.obs_norm.count.item() == 2


def test_image_observations_use_the_newest_frame_normalised_per_pixel():
    rnd = RND(PIXELS, features=32, frames=1)
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (6, 4, 84, 84), generator=g, dtype=torch.uint8)
    assert rnd.select(obs).shape == (6, 1, 84, 84) and torch.equal(rnd.select(obs)[:, 0], obs[:, 3])
    rnd.update_obs_norm(obs)
    assert rnd.obs_norm.mean.shape == (1, 84, 84)
    x = rnd.prepare(obs)
    assert x.dtype == torch.float32 and x.abs().max() <= 5.0
    assert rnd.novelty(obs).shape == (6,)
    assert RND(PIXELS, features=32, frames=0).select(obs).shape == (6, 4, 84, 84)


def test_predictor_mask_is_reproducible_from_its_stream_and_keeps_the_fraction():
    def masks(seed):
        rnd = RND(FLAT, generator=torch.Generator().manual_seed(seed))
        return torch.stack([rnd.mask(4000, 0.25) for _ in range(3)])

    a, b, c = masks(7), masks(7), masks(8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])  # a fresh draw each call
    assert abs(a.float().mean().item() - 0.25) < 0.02


def test_predictor_loss_averages_over_the_masked_samples_only():
    g = torch.Generator().manual_seed(3)
    rnd = RND(FLAT, generator=g)
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    state = g.get_state()
    loss, trained = rnd.loss(obs, 0.5)
    g.set_state(state)
    keep = rnd.mask(64, 0.5)
    assert trained.item() == keep.sum().item()
    torch.testing.assert_close(loss, rnd.errors(obs)[keep].mean())
    torch.testing.assert_close(rnd.loss(obs, 1.0)[0], rnd.errors(obs).mean())


def test_predictor_loss_moves_only_the_predictor_never_the_target():
    for space in (FLAT, PIXELS):
        rnd = RND(space, features=16)
        obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8) if space is PIXELS else torch.randn(8, 3)
        rnd.update_obs_norm(obs)
        loss, _ = rnd.loss(obs, 1.0)
        loss.backward()
        assert all(p.grad is None and not p.requires_grad for p in rnd.target.parameters())
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rnd.predictor.parameters())


def test_novelty_of_an_observation_seen_many_times_falls_and_a_new_one_stays_high():
    torch.manual_seed(0)
    rnd = RND(FLAT, generator=torch.Generator().manual_seed(0))
    seen = torch.tensor([[0.5, -1.0, 2.0]]).repeat(32, 1)
    g = torch.Generator().manual_seed(1)
    rnd.update_obs_norm(torch.randn(256, 3, generator=g))
    new = torch.tensor([[-2.0, 2.0, -1.0]])
    before_seen = rnd.novelty(seen[:1]).item()
    opt = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    for _ in range(200):
        loss, _ = rnd.loss(seen, 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after_seen, after_new = rnd.novelty(seen[:1]).item(), rnd.novelty(new).item()
    assert after_seen < 0.01 * before_seen
    assert after_new > 10 * after_seen


def test_rnd_state_dict_holds_networks_and_observation_statistics():
    a = RND(FLAT)
    a.update_obs_norm(torch.randn(10, 3))
    b = RND(FLAT)
    b.load_state_dict(a.state_dict())
    obs = torch.randn(5, 3)
    assert torch.equal(a.novelty(obs), b.novelty(obs))
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(a.state_dict())


# --- ppo_rnd ----------------------------------------------------------------------------

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}
SMALL_PIXELS = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)  # the smallest the Nature CNN takes


def make_algo(obs_space=FLAT, num_envs=2, **kw):
    cfg = PPORNDConfig(**{"n_steps": 8, "batch_size": 16, "n_epochs": 1, "warmup_steps": 0, **kw})
    return PPORND(cfg, obs_space, gym.spaces.Discrete(3), num_envs, torch.device("cpu"), RNGStreams(0))


def random_obs(space, n, g):
    if space.dtype == np.uint8:
        return torch.randint(0, 256, (n, *space.shape), generator=g, dtype=torch.uint8)
    return torch.randn(n, *space.shape, generator=g)


def fill(algo, steps=None, done_every=5):
    """Feed ``steps`` random vector steps (an episode ends every ``done_every``, terminated in
    column 0 and truncated in column 1)."""
    g = torch.Generator().manual_seed(0)
    n = algo.num_envs
    obs = random_obs(algo.obs_space, n, g)
    for t in range(steps or algo.cfg.n_steps):
        with torch.no_grad():
            _, extras = algo.explore(obs)
            nxt = random_obs(algo.obs_space, n, g)
            end = (t + 1) % done_every == 0
            term = torch.tensor([end] + [False] * (n - 1))
            trunc = torch.tensor([False] + [end] * (n - 1))
            algo.observe(Step(obs, extras, -torch.ones(n), term, trunc, nxt, nxt))
        obs = nxt


def grads(loss, params):
    return [torch.zeros_like(p) if g is None else g
            for p, g in zip(params, torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True))]


def member_moved(gs, k):
    """Whether any gradient reaches body member ``k`` (policy 0, extrinsic value 1, intrinsic value 2)."""
    return any(g[k].abs().sum().item() > 0 for g in gs)


@pytest.mark.parametrize("space", [FLAT, SMALL_PIXELS], ids=["flat", "pixels"])
def test_each_loss_moves_only_its_own_parameters(space):
    """What is checked: the policy term (pg - entropy, vf_coef=0) reaches only body member 0, the
    extrinsic value term only member 1, the intrinsic value loss only member 2; none of them
    reaches RND; the predictor loss reaches only the predictor, never the target nor the actor.
    On pixels the Nature-CNN torso is shared by the three heads (the paper's network) and
    gets gradient from each of them. The two optimizers hold disjoint parameters and neither
    holds the target."""
    algo = make_algo(space, ent_coef=0.01)
    fill(algo)
    batch = algo.prepare_batch()
    body = list(algo.actor.body.parameters())
    torso = list(algo.actor.cnn.parameters()) if algo.actor.cnn is not None else []
    actor = list(algo.actor.parameters())
    predictor, target = list(algo.rnd.predictor.parameters()), list(algo.rnd.target.parameters())
    assert all(not p.requires_grad for p in target)

    ppo_part, v_loss_int, rnd_loss, _ = algo.minibatch_losses(batch, None, 0.2)
    algo.cfg.vf_coef = 0.0
    policy_part, _, _, _ = algo.minibatch_losses(batch, None, 0.2)
    ext_value_part = ppo_part - policy_part  # 0.5 * v_loss (extrinsic)

    g = grads(policy_part, body)
    assert member_moved(g, 0) and not member_moved(g, 1) and not member_moved(g, 2)
    g = grads(ext_value_part, body)
    assert member_moved(g, 1) and not member_moved(g, 0) and not member_moved(g, 2)
    g = grads(v_loss_int, body)
    assert member_moved(g, 2) and not member_moved(g, 0) and not member_moved(g, 1)
    for loss in (policy_part, ext_value_part, v_loss_int):
        assert all(x.abs().sum() == 0 for x in grads(loss, predictor))
        if torso:
            assert any(x.abs().sum() > 0 for x in grads(loss, torso))
    assert all(x.abs().sum() == 0 for x in grads(rnd_loss, actor))
    assert all(x.abs().sum() > 0 for x in grads(rnd_loss, predictor))

    in_opt = {id(p) for p in algo.optimizer.params}
    in_rnd_opt = {id(p) for p in algo.rnd_optimizer.params}
    assert in_opt == {id(p) for p in actor} and in_rnd_opt == {id(p) for p in predictor}
    assert not ({id(p) for p in target} & (in_opt | in_rnd_opt))

    target_before = [p.clone() for p in target]
    algo.cfg.vf_coef = 0.5
    algo.update(0.0)
    assert all(torch.equal(a, b) for a, b in zip(target_before, target))


def test_intrinsic_returns_are_non_episodic_and_extrinsic_ones_episodic():
    # gamma 1 and lambda 1: each stream's return is a plain sum; column 0 terminates at step 5
    algo = make_algo(num_envs=2, n_steps=8, batch_size=16, gamma=1.0, int_gamma=1.0, gae_lambda=1.0)
    fill(algo, done_every=5)
    with torch.no_grad():  # zero values everywhere: the returns are the rewards' sums
        for p in algo.actor.body.parameters():
            p.zero_()
        algo.int_values.zero_()
        algo.storage.data.values.zero_()
    batch = algo.prepare_batch()
    ret_ext, ret_int = batch.ret.view(8, 2)[:, 0], batch.ret_int.view(8, 2)[:, 0]
    r_int = algo.int_norm.normalize(algo.novelty[:, 0])
    # extrinsic: -1 per step, cut at the termination after step index 4
    torch.testing.assert_close(ret_ext, torch.tensor([-5.0, -4, -3, -2, -1, -3, -2, -1]))
    # intrinsic: runs across the termination to the rollout's end (bootstrap 0 there)
    torch.testing.assert_close(ret_int, r_int.flip(0).cumsum(0).flip(0))
    episodic = make_algo(num_envs=2, n_steps=8, batch_size=16, gamma=1.0, int_gamma=1.0, gae_lambda=1.0,
                         int_episodic=True)
    fill(episodic, done_every=5)
    with torch.no_grad():
        for p in episodic.actor.body.parameters():
            p.zero_()
        episodic.int_values.zero_()
    cut = episodic.prepare_batch().ret_int.view(8, 2)[:, 0]
    r = episodic.int_norm.normalize(episodic.novelty[:, 0])
    torch.testing.assert_close(cut[:5], r[:5].flip(0).cumsum(0).flip(0))


def test_intrinsic_reward_is_novelty_over_the_running_std_of_per_env_filtered_returns():
    algo = make_algo(num_envs=3, n_steps=6, batch_size=18, int_gamma=0.9)
    fill(algo)
    expected = IntrinsicReturnNormalizer(3, 0.9)
    R = expected.forward_filter(algo.novelty.clone())
    torch.testing.assert_close(algo.int_returns, R)
    expected.update(R)
    stats = algo.update(0.0)
    torch.testing.assert_close(algo.int_norm.std, expected.std)
    assert stats["int_reward"] == pytest.approx((algo.novelty / expected.std).mean().item(), rel=1e-5)
    torch.testing.assert_close(algo.int_norm.ret, R[-1])  # carried into the next rollout


def test_warm_up_acts_at_random_feeds_only_rnds_normaliser_and_stores_nothing():
    algo = make_algo(warmup_steps=10)  # 2 envs: 5 vector steps
    fill(algo, steps=5)
    assert algo.storage.step == 0 and algo.rnd.obs_norm.count.item() == 10 and algo.env_steps == 10
    with torch.no_grad():
        _, ex = algo.explore(torch.zeros(2, 3))
    assert not ex.warmup.any()
    fill(algo, steps=3)
    assert algo.storage.step == 3
    # a warm-up step's log-prob is the uniform law's
    fresh = make_algo(warmup_steps=10)
    with torch.no_grad():
        _, ex = fresh.explore(torch.zeros(2, 3))
    assert ex.warmup.all()
    torch.testing.assert_close(ex.log_prob, torch.full((2,), -math.log(3)))


def test_ppo_rnd_refuses_observations_rnd_cannot_read():
    with pytest.raises(UserError, match="ppo_rnd needs Box observations"):
        PPORND(PPORNDConfig(), gym.spaces.Discrete(5), gym.spaces.Discrete(2), 1, torch.device("cpu"),
               RNGStreams(0))


# a constant learning rate: the resume test trains n steps then resumes to 2n, where a schedule over
# the budget would differ from the 2n run's
SMOKE = ["ppo_rnd.n_steps=16", "ppo_rnd.batch_size=32", "ppo_rnd.n_epochs=2", "ppo_rnd.warmup_steps=64",
         "env.num_envs=2", "ppo_rnd.lr_schedule=constant"]


def test_ppo_rnd_runs_through_the_cli(tmp_path, capsys):
    args = ["train", "ppo_rnd", "MountainCar-v0", "--steps", "512", "--run-dir", str(tmp_path / "r"), "--json",
            "--set", "tensorboard=false", "--set", "eval.episodes=1", *sum((["--set", s] for s in SMOKE), [])]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 512
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "rnd_loss" in r]
    assert updates
    # the 64 warm-up steps store nothing: 448 steps make 14 rollouts of 32
    assert load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")["algo"]["updates"] == 14
    for key in ("rnd_loss", "v_loss_int", "novelty", "int_reward", "int_return_std", "v_loss", "pg_loss"):
        assert all(math.isfinite(r[key]) for r in updates), key


def test_ppo_rnd_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    sets = [*SMOKE, "ppo_rnd.normalize_obs=true", *[f"{k}={v}" for k, v in QUIET.items()]]
    n = 256  # the warm-up (64) and 6 updates before the checkpoint, 8 after
    a = Learner(build_config("ppo_rnd", "MountainCar-v0", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", "ppo_rnd", "MountainCar-v0", "--steps", str(n), "--seed", "3", "--run-dir",
                 str(tmp_path / "b"), *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")["algo"]
    sa = a.algo.state_dict()
    for name in ("actor", "rnd", "int_norm"):
        for k, v in sa[name].items():
            assert torch.equal(v, b[name][k]), f"{name}.{k}"
    for name in ("optimizer", "rnd_optimizer"):
        assert torch.equal(sa[name]["exp_avg"], b[name]["exp_avg"]) and sa[name]["steps"] == b[name]["steps"]
    assert a.algo.updates == 14 and b["env_steps"] == 2 * n
    assert sa["rnd_optimizer"]["steps"] > 0 and sa["int_norm"]["stats.count"] > 0


def test_with_collectors_each_ones_intrinsic_returns_run_along_its_own_time_in_process():
    from corral.schemes.fragments import FragmentScheme

    L = Learner(build_config("ppo_rnd", "MountainCar-v0", steps=4 * 2 * 2 * 16, overrides={
        **QUIET, "scheme.collectors": 2, "env.num_envs": 2, "ppo_rnd.n_steps": 16, "ppo_rnd.batch_size": 32,
        "ppo_rnd.n_epochs": 1, "ppo_rnd.warmup_steps": 0}), None, env_spec="MountainCar-v0", quiet=True)
    scheme = FragmentScheme(L)
    log, current = [], {}

    def on_fragment(meta, data):  # the learner's algorithm exists (rebuilt for K fragments) by now
        current["worker"] = meta.worker
        norm = L.algo.int_norm
        if not hasattr(norm, "logged"):
            step = norm.step
            norm.logged = True
            norm.step = lambda r: log.append((current["worker"], r.clone(), step(r))) or log[-1][2]

    scheme.fragment_callback = on_fragment
    L.make_stream = scheme.stream
    L.train()
    assert L.algo.updates == 4 and {w for w, _, _ in log} == {0, 1}
    for k in (0, 1):
        own = IntrinsicReturnNormalizer(2, L.algo.cfg.int_gamma)
        for w, r, R in log:
            if w == k:
                torch.testing.assert_close(own.step(r), R, rtol=0, atol=0)
    one = IntrinsicReturnNormalizer(2, L.algo.cfg.int_gamma)  # one filter through both collectors' steps
    assert not all(torch.equal(one.step(r), R) for _, r, R in log)


def test_ppo_rnd_learns_from_two_ray_collectors(ray_local):
    L = Learner(build_config("ppo_rnd", "MountainCar-v0", steps=2 * 2 * 2 * 16, overrides={
        **QUIET, "scheme.collectors": 2, "env.num_envs": 2, "ppo_rnd.n_steps": 16, "ppo_rnd.batch_size": 32,
        "ppo_rnd.n_epochs": 1, "ppo_rnd.warmup_steps": 64}), None, env_spec="MountainCar-v0", quiet=True)
    rows = list(L.make_stream())
    # two rounds of 2 fragments of 32 steps: the first, started at env step 0, was warm-up (random
    # actions, RND's normaliser only); the second is one update's rollout
    assert L.algo.updates == 1 and L.algo.rnd.obs_norm.count.item() == 64 + 64
    assert L.algo.rnd_optimizer.steps == 2 and math.isfinite(rows[-1]["rnd_loss"])


atari = pytest.mark.skipif(not __import__("importlib").util.find_spec("ale_py"), reason="ale-py not installed")


@atari
def test_ppo_rnd_runs_montezumas_revenge_through_the_loop(tmp_path, capsys):
    # 768 agent steps = 3,072 frames with the Atari preset's networks (RND's 512 features on the
    # newest 84x84 frame), a short warm-up and rollout; one evaluation episode capped at 100 steps
    args = ["train", "ppo_rnd", "ALE/MontezumaRevenge-v5", "--steps", "768", "--run-dir", str(tmp_path / "r"),
            "--json", "--set", "tensorboard=false", "--set", "eval.episodes=1", "--set", "eval.max_episode_steps=100",
            "--set", "env.num_envs=2", "--set", "ppo_rnd.n_steps=64", "--set", "ppo_rnd.batch_size=128",
            "--set", "ppo_rnd.n_epochs=1", "--set", "ppo_rnd.warmup_steps=256"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 768
    state = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert state["config"]["ppo_rnd"]["rnd_features"] == 512  # the preset's
    algo = state["algo"]
    assert algo["updates"] == (768 - 256) // 128 and algo["rnd_optimizer"]["steps"] == algo["updates"]
    assert algo["rnd"]["obs_norm.mean"].shape == (1, 84, 84) and algo["rnd"]["obs_norm.count"] == 768
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["rnd_loss"]) and r["novelty"] > 0 for r in rows if "rnd_loss" in r)


# --- learning on MountainCar-v0: -1 every step until the flag, so without exploration every
# episode's return is -200 and PPO's policy gradient has nothing to follow


def best_eval_agent(algo, tmp_path, steps, seed=0, **overrides):
    """Train with periodic deterministic evaluation; the best evaluation's checkpoint."""
    corral.train(algo, "MountainCar-v0", steps=steps, seed=seed, run_dir=str(tmp_path / algo),
                 **{"eval.every": 5000, "eval.episodes": 5, "tensorboard": False, "progress": False, **overrides})
    return corral.load(tmp_path / algo)


def test_ppo_rnd_reaches_the_flag_on_mountaincar_within_30k_steps_where_ppo_at_its_settings_does_not(tmp_path):
    # seed 0: ppo_rnd's best periodic evaluation reaches the flag from 6k steps on (held-out -177.0);
    # the same PPO without RND first does at 49k (docs/ledger.md)
    rnd = best_eval_agent("ppo_rnd", tmp_path, 30_000)
    result = corral.evaluate(rnd, "MountainCar-v0", episodes=10, seed=123)
    assert result["mean_return"] >= -190, result
    ppo = best_eval_agent("ppo", tmp_path, 30_000, **ppo_at_the_settings_of("ppo_rnd", "MountainCar-v0"))
    assert ppo.cfg.algo_cfg.gamma == 0.999 and ppo.cfg.env.num_envs == 32
    assert corral.evaluate(ppo, "MountainCar-v0", episodes=10, seed=123)["mean_return"] == -200


# CleanRL's ppo.py hyperparameters (4 envs, 128-step rollouts, 4 epochs of 4 minibatches, lr 2.5e-4
# annealed, entropy 0.01, gamma 0.99; value clipping left out), which stay at -200.00 +- 0.00 at 500k
CLEANRL_PPO = {"env.num_envs": 4, "ppo.n_steps": 128, "ppo.batch_size": 128, "ppo.n_epochs": 4, "ppo.lr": 2.5e-4,
               "ppo.lr_schedule": "linear", "ppo.ent_coef": 0.01, "ppo.gamma": 0.99}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_ppo_rnd_presets_final_policy_keeps_the_flag_on_mountaincar(seed, tmp_path):
    """The final policy, not the best checkpoint: with the learning rate annealed it keeps what
    the intrinsic reward found (seeds 0-4 held out: -169.6, -177.3, -126.7, -127.4, -185.0; at a
    constant rate seed 0 ended at -200)."""
    corral.train("ppo_rnd", "MountainCar-v0", seed=seed, run_dir=str(tmp_path / "r"),
                 **{"eval.episodes": 0, "tensorboard": False, "progress": False})
    final = corral.load(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert corral.evaluate(final, "MountainCar-v0", episodes=10, seed=123)["mean_return"] >= -195


@pytest.mark.slow
def test_ppo_rnd_preset_reaches_the_flag_on_mountaincar_within_300k_steps_where_cleanrls_ppo_stays_at_minus_200(
        tmp_path):
    rnd = best_eval_agent("ppo_rnd", tmp_path, 300_000)
    assert corral.evaluate(rnd, "MountainCar-v0", episodes=10, seed=123)["mean_return"] >= -190
    ppo = best_eval_agent("ppo", tmp_path, 300_000, **{"eval.every": 20_000, **CLEANRL_PPO})
    assert corral.evaluate(ppo, "MountainCar-v0", episodes=10, seed=123)["mean_return"] == -200
