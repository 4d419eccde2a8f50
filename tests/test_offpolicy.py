"""Off-policy algorithms: smoke runs, losses against hand computations, gradient isolation,
exact resume with the replay buffer, and bad input."""

import json
import math
import os
import subprocess
import sys
from dataclasses import fields, replace

import gymnasium as gym
import pytest
import torch

import corral
from corral.algos import get_algo
from corral.algos.base import Step
from corral.cli import main
from corral.rng import RNGStreams
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = ["--set", "tensorboard=false", "--set", "eval.episodes=1"]
TINY = {"dqn": ["learning_starts=64", "batch_size=32", "train_freq=4", "target_update_interval=50", "hidden=[32]"],
        "td3": ["learning_starts=64", "batch_size=32", "hidden=[32]"],
        "sac": ["learning_starts=64", "batch_size=32", "hidden=[32]"]}


def tiny(algo):
    base = get_algo(algo).cls.name
    return [f"{algo}.{kv}" for kv in TINY[base]]


@pytest.mark.parametrize("algo,env", [
    ("dqn", "CartPole-v1"), ("double_dqn", "CartPole-v1"), ("dueling_dqn", "CartPole-v1"), ("d3qn", "Acrobot-v1"),
    ("per_d3qn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("sac", "Pendulum-v1"),
])
def test_every_off_policy_algorithm_runs_through_the_cli(tmp_path, capsys, algo, env):
    args = ["train", algo, env, "--steps", "300", "--run-dir", str(tmp_path / "r"), "--json", *QUIET]
    for kv in tiny(algo) + [f"{algo}.n_step=3"] * (algo == "per_d3qn"):
        args += ["--set", kv]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 300
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("q_loss" in r or "critic_loss" in r for r in rows)


def make(algo, env_id="Pendulum-v1", num_envs=1, **overrides):
    env = gym.make(env_id)
    return make_on(algo, env.observation_space, env.action_space, num_envs, **overrides)


def make_on(algo, obs_space, act_space, num_envs=1, **overrides):
    spec = get_algo(algo)
    cfg = spec.cls.Config()
    for k, v in {**spec.overrides, **overrides}.items():
        setattr(cfg, k, v)
    a = spec.cls(cfg, obs_space, act_space, num_envs, torch.device("cpu"), RNGStreams(0))
    a.total_steps = 1000
    return a


@torch.no_grad()
def fill(algo, n, obs_dim, act_fn):
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        obs = torch.randn(algo.num_envs, obs_dim, generator=g)
        action, extras = algo.explore(obs)
        nxt = torch.randn(algo.num_envs, obs_dim, generator=g)
        algo.observe(Step(obs, extras, torch.randn(algo.num_envs, generator=g),
                          torch.zeros(algo.num_envs, dtype=torch.bool), torch.zeros(algo.num_envs, dtype=torch.bool),
                          nxt, nxt))


def test_double_dqn_target_uses_the_online_argmax_and_the_target_value():
    algo = make("double_dqn", "CartPole-v1", learning_starts=0, batch_size=8, hidden=(16,), lr=0.0)
    fill(algo, 20, 4, None)
    with torch.no_grad():  # make the target net differ from the online net
        for p in algo.target.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    batch = algo.replay.sample(8)
    algo.replay.load_state_dict(algo.replay.state_dict())
    with torch.no_grad():
        a_star = algo.actor.q(batch.next_obs).argmax(-1)
        target = batch.reward + batch.discount * algo.target.q(batch.next_obs)[torch.arange(8), a_star]
        q = algo.actor.q(batch.obs)[torch.arange(8), batch.action]
        expected = torch.nn.functional.smooth_l1_loss(q, target)
    stats, _ = algo.train_step(batch)
    assert stats["q_loss"].item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("double", [False, True])
def test_a_dqn_update_matches_sampling_and_stepping_one_batch_at_a_time(double):
    # update() draws all of a uniform update's batches at once and runs the target net once over
    # every step's next_obs; that must be the same training as one sample and one target per step.
    kw = dict(learning_starts=0, batch_size=8, hidden=(16,), gradient_steps=5, double=double)
    a, b = make("dqn", "CartPole-v1", **kw), make("dqn", "CartPole-v1", **kw)
    fill(a, 30, 4, None)
    fill(b, 30, 4, None)
    a.update(0.5)
    for _ in range(5):
        b.train_step(b.replay.sample(8))
        b.grad_steps += 1
    for pa, pb in zip(a.actor.parameters(), b.actor.parameters()):
        assert torch.allclose(pa, pb, rtol=1e-5, atol=1e-6)
    assert torch.equal(a.replay.sample(8).indices, b.replay.sample(8).indices)  # same replay stream position


def phase_grads(algo, batch, noise=None):
    """Drive one gradient step's phases as train_step does, but before each optimizer step
    zero every optimizer's gradient and record, per phase, which networks the loss gave a
    nonzero gradient and which networks the step moved."""
    from corral.algos.offpolicy import drive

    nets = {"actor": list(algo.actor.parameters()), "critics": list(algo.critics.parameters())}
    if getattr(algo, "auto_alpha", False):
        nets["log_alpha"] = [algo.log_alpha]
    names = {id(getattr(algo, n)): n for n in algo.optimizers if getattr(algo, n) is not None}
    phases = []

    def step(optimizer, loss):
        for o in algo.declared_optimizers():
            o.zero_grad()
        loss.backward()
        before = {k: [p.detach().clone() for p in ps] for k, ps in nets.items()}
        graded = {k for k, ps in nets.items() if any(p.grad is not None and p.grad.abs().sum() > 0 for p in ps)}
        optimizer.step()
        moved = {k for k, ps in nets.items() if any(not torch.equal(a, p) for a, p in zip(before[k], ps))}
        phases.append((names[id(optimizer)], graded, moved))

    noise = algo.draw_noise(batch.obs.shape[0]) if noise is None else noise
    drive(algo.phases(batch, noise), step)
    return phases


@pytest.mark.parametrize("algo_name", ["sac", "td3"])
def test_each_loss_reaches_and_moves_only_its_own_network(algo_name):
    # every learning rate nonzero: a loss that leaked gradient into another network would move it
    algo = make(algo_name, learning_starts=0, batch_size=16, hidden=(16,), lr=1e-2, policy_delay=1)
    fill(algo, 40, 3, None)
    phases = phase_grads(algo, algo.replay.sample(16))
    expected = [("critic_opt", {"critics"}, {"critics"}), ("actor_opt", {"actor"}, {"actor"})]
    if algo_name == "sac":
        expected.append(("alpha_opt", {"log_alpha"}, {"log_alpha"}))
    assert phases == expected
    # and the critics' requires_grad is back on for the next critic step
    assert all(p.requires_grad for p in algo.critics.parameters())


def test_td3_delays_the_actor_by_policy_delay():
    algo = make("td3", learning_starts=0, batch_size=16, hidden=(16,), policy_delay=2)
    fill(algo, 40, 3, None)
    before = [p.clone() for p in algo.actor.parameters()]
    algo.train_step(algo.replay.sample(16))  # grad step 1: critics only
    assert all(torch.equal(a, b) for a, b in zip(before, algo.actor.parameters()))
    algo.grad_steps += 1
    algo.train_step(algo.replay.sample(16))  # grad step 2: actor too
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.actor.parameters()))


def td3_critic_loss_by_hand(algo, batch, z):
    """TD3's critic loss from the paper: a' = clip(mu'(s') + clip(sigma z, -c, c), -1, 1)."""
    cfg = algo.cfg
    with torch.no_grad():
        next_obs = algo.actor.enc(batch.next_obs)
        a = algo.actor_target(next_obs)
        if cfg.target_noise > 0:
            a = (a + (cfg.target_noise * z).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)).clamp(-1, 1)
        target = batch.reward + batch.discount * algo.critics_target(next_obs, a).min(0).values
        q = algo.critics(algo.actor.enc(batch.obs), algo.actor.box.to_unit(batch.action))
        return (q - target).square().mean(1).sum()


def test_td3_smooths_target_actions_with_clipped_noise():
    algo = make("td3", learning_starts=0, batch_size=16, hidden=(16,), target_noise=0.2, target_noise_clip=0.5)
    fill(algo, 40, 3, None)
    with torch.no_grad():  # targets apart from the online nets, and a target actor away from the bounds
        for p in list(algo.critics_target.parameters()) + list(algo.actor_target.parameters()):
            p.mul_(0.5).add_(0.1 * torch.randn_like(p))
    batch = algo.replay.sample(16)

    def loss(z):
        _, critic_loss = next(algo.phases(batch, {"target": z}))
        return critic_loss.item()

    g = torch.Generator().manual_seed(5)
    z = torch.randn(16, 1, generator=g) * 2  # some draws past the clip (0.2 * |z| > 0.5)
    assert (0.2 * z.abs() > 0.5).any() and (0.2 * z.abs() < 0.5).any()
    assert loss(z) == pytest.approx(td3_critic_loss_by_hand(algo, batch, z).item(), rel=1e-5)
    # the noise is applied: it changes the target ...
    zero = loss(torch.zeros(16, 1))
    assert abs(loss(torch.full((16, 1), 1.0)) - zero) > 1e-4
    # ... and clipped: 0.2 * 3 and 0.2 * 30 both clip to 0.5
    assert loss(torch.full((16, 1), 3.0)) == pytest.approx(loss(torch.full((16, 1), 30.0)), rel=1e-6)
    assert loss(torch.full((16, 1), 3.0)) != pytest.approx(loss(torch.full((16, 1), 2.0)), rel=1e-6)
    # with target_noise 0 there is no smoothing and train_step draws no noise
    algo.cfg.target_noise = 0.0
    assert algo.draw_noise(16) == {}
    _, unsmoothed = next(algo.phases(batch, {}))
    assert unsmoothed.item() == pytest.approx(zero, rel=1e-6)
    assert unsmoothed.item() == pytest.approx(td3_critic_loss_by_hand(algo, batch, None).item(), rel=1e-5)


# --- SAC's temperature and squashed Gaussian


def test_sac_target_entropy_defaults_to_minus_the_action_dimension():
    obs = gym.spaces.Box(-1, 1, (3,))
    for dim in (1, 3, 6):
        assert make_on("sac", obs, gym.spaces.Box(-2, 2, (dim,))).target_entropy == -dim
    assert make_on("sac", obs, gym.spaces.Box(-2, 2, (2, 3))).target_entropy == -6  # all action dims
    assert make_on("sac", obs, gym.spaces.Box(-2, 2, (3,)), target_entropy=-0.5).target_entropy == -0.5


@pytest.mark.parametrize("target", [10.0, -50.0])
def test_sac_temperature_rises_below_the_entropy_target_and_falls_above_it(target):
    from corral.algos.offpolicy import drive

    algo = make("sac", learning_starts=0, batch_size=16, hidden=(16,), target_entropy=target)
    fill(algo, 40, 3, None)
    batch = algo.replay.sample(16)
    noise = algo.draw_noise(16)
    with torch.no_grad():
        _, logp = algo.actor(algo.actor.enc(batch.obs), noise=noise["new"])
    entropy = -logp.mean().item()
    assert entropy < 10.0 and entropy > -50.0  # so target 10 is above the entropy and -50 below
    grads = []

    def step(optimizer, loss):
        optimizer.zero_grad()
        loss.backward()
        if optimizer is algo.alpha_opt:
            grads.append(algo.log_alpha.grad.item())
        optimizer.step()

    before = algo.log_alpha.item()
    drive(algo.phases(batch, noise), step)
    # d/d log_alpha of -log_alpha * (log pi + target), averaged: entropy - target
    assert grads == [pytest.approx(entropy - target, rel=1e-5)]
    if entropy < target:
        assert algo.log_alpha.item() > before
    else:
        assert algo.log_alpha.item() < before


def test_sac_with_a_fixed_ent_coef_keeps_alpha_and_uses_it_in_the_actor_loss():
    algo = make("sac", learning_starts=0, batch_size=16, hidden=(16,), ent_coef=0.3, lr=1e-2)
    assert algo.alpha_opt is None and not algo.log_alpha.requires_grad
    fill(algo, 40, 3, None)
    for _ in range(3):
        stats, _ = algo.train_step(algo.replay.sample(16))
        assert stats["alpha"].item() == pytest.approx(0.3)
    assert algo.log_alpha.item() == pytest.approx(math.log(0.3), abs=1e-7)
    batch = algo.replay.sample(16)
    noise = algo.draw_noise(16)
    steps = algo.phases(batch, noise)
    next(steps)
    optimizer, actor_loss = steps.send(None)
    assert optimizer is algo.actor_opt
    with pytest.raises(StopIteration):  # no temperature phase
        steps.send(None)
    with torch.no_grad():
        obs = algo.actor.enc(batch.obs)
        a, logp = algo.actor(obs, noise=noise["new"])
        expected = (0.3 * logp - algo.critics(obs, a).min(0).values).mean()
    assert actor_loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_squashed_gaussian_log_prob_is_torch_distributions_tanh_normal():
    from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

    from corral.actors.offpolicy import LOG_STD_MAX, LOG_STD_MIN, SquashedGaussianActor

    low, high = torch.tensor([-2.0, 0.0, -1.0]), torch.tensor([2.0, 1.0, 3.0])
    actor = SquashedGaussianActor(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(low.numpy(), high.numpy()),
                                  hidden=(16,)).double()
    g = torch.Generator().manual_seed(0)
    x = 0.3 * torch.randn(64, 5, generator=g, dtype=torch.float64)
    noise = torch.randn(64, 3, generator=g, dtype=torch.float64).clamp(-1.5, 1.5)
    action, logp = actor(x, noise=noise)
    mean, log_std = actor.net(x).chunk(2, -1)
    std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
    pre = mean + std * noise
    assert pre.abs().max() < 4  # where atanh in TransformedDistribution.log_prob is accurate in float64
    unit = TransformedDistribution(Normal(mean, std), [TanhTransform()])
    torch.testing.assert_close(action, torch.tanh(pre))
    torch.testing.assert_close(logp, unit.log_prob(action).sum(-1))
    # to the env's bounds: an affine map, whose density differs by the constant sum log((high - low) / 2)
    scale, loc = ((high - low) / 2).double(), ((high + low) / 2).double()
    env = TransformedDistribution(Normal(mean, std), [TanhTransform(), AffineTransform(loc, scale)])
    env_action = actor.box.double().to_env(action)
    torch.testing.assert_close(env_action, loc + scale * action)
    torch.testing.assert_close(env.log_prob(env_action).sum(-1), logp - scale.log().sum())
    # saturated tanh: finite and equal to log N(pre) - sum log(1 - tanh(pre)^2) in exact form
    big = torch.full((4, 3), 30.0, dtype=torch.float64) * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]],
                                                                        dtype=torch.float64)
    actor32 = SquashedGaussianActor(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(-1, 1, (3,)), hidden=(16,))
    with torch.no_grad():
        actor32.net[-1].weight.zero_()
        actor32.net[-1].bias.zero_()  # mean 0, log_std 0
    _, lp = actor32(torch.zeros(4, 5), noise=big.float())
    exact = (-0.5 * 30.0**2 - 0.5 * math.log(2 * math.pi)) * 3 - 3 * (math.log(4) - 60.0 - 2 * math.log1p(math.exp(-60)))
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp, torch.full((4,), exact), rtol=1e-5, atol=1e-3)


# --- DQN: dueling head and the epsilon schedule


def test_dueling_q_is_value_plus_advantage_minus_its_mean_on_a_hand_set_network():
    from corral.actors.offpolicy import QNetwork

    net = QNetwork(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), hidden=(8, 8), dueling=True)
    with torch.no_grad():
        w, bias = net.streams.weights[-1], net.streams.biases[-1]  # [2 streams, out, in], [2, 1, out]
        w.zero_()
        bias[0, 0] = torch.tensor([2.0, 99.0, -99.0])  # V = 2; the value stream's other outputs are unused
        bias[1, 0] = torch.tensor([1.0, 2.0, 6.0])  # A, mean 3
    x = torch.randn(5, 4)
    torch.testing.assert_close(net.q(x), torch.tensor([[0.0, 1.0, 5.0]]).expand(5, 3))
    with torch.no_grad():
        bias[1, 0] += 10.0  # a constant added to A changes nothing
        bias[0, 0, 0] += 0.5  # V shifts every Q
    torch.testing.assert_close(net.q(x), torch.tensor([[0.5, 1.5, 5.5]]).expand(5, 3))


def test_dqn_epsilon_decays_linearly_over_the_exploration_fraction_then_stays():
    algo = make("dqn", "CartPole-v1", exploration_fraction=0.2, exploration_initial_eps=1.0,
                exploration_final_eps=0.1)
    algo.total_steps = 1000  # decay over the first 200 env steps
    for steps, eps in [(0, 1.0), (50, 0.775), (100, 0.55), (199, 0.1045), (200, 0.1), (600, 0.1), (5000, 0.1)]:
        algo.env_steps = steps
        assert algo.epsilon == pytest.approx(eps), steps
    L = Learner(build_config("dqn", "CartPole-v1", steps=1234, overrides={"eval.episodes": 0, "tensorboard": False}),
                None, quiet=True)
    assert L.algo.total_steps == 1234  # the Learner sets the run's budget the schedule spans


@pytest.mark.parametrize("eps", [0.0, 1.0])
def test_dqn_explore_acts_greedily_at_epsilon_zero_and_uniformly_at_one(eps):
    algo = make("dqn", "CartPole-v1", exploration_initial_eps=eps, exploration_final_eps=eps, hidden=(16,))
    obs = torch.randn(4000, 4, generator=torch.Generator().manual_seed(0))
    action, _ = algo.explore(obs)
    greedy = algo.actor.q(obs).argmax(-1)
    agree = (action == greedy).float().mean().item()
    # eps 1: uniform over 2 actions agrees with greedy half the time (4000 draws: +-0.03 is 4 sigma)
    assert agree == 1.0 if eps == 0.0 else abs(agree - 0.5) < 0.03


# --- prioritized replay: the importance weights reach every TD loss


def first_loss_grads(algo, batch, noise):
    steps = algo.phases(batch, noise)
    optimizer, loss = next(steps)
    steps.close()
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, optimizer.params)])


def rows(batch, idx):
    return replace(batch, **{f.name: getattr(batch, f.name)[idx] for f in fields(batch)})


@pytest.mark.parametrize("algo_name,env_id,obs_dim", [("dqn", "CartPole-v1", 4), ("sac", "Pendulum-v1", 3),
                                                      ("td3", "Pendulum-v1", 3)])
def test_per_weights_multiply_each_samples_td_loss(algo_name, env_id, obs_dim):
    algo = make(algo_name, env_id, prioritized=True, learning_starts=0, batch_size=8, hidden=(16,))
    fill(algo, 40, obs_dim, None)
    batch = algo.replay.sample(8)
    noise = algo.draw_noise(8)
    k = 3
    one_hot = torch.zeros(8)
    one_hot[k] = 1.0
    weighted = first_loss_grads(algo, replace(batch, weights=one_hot), noise)
    alone = first_loss_grads(algo, replace(rows(batch, slice(k, k + 1)), weights=torch.ones(1)),
                             {n: v[k:k + 1] for n, v in noise.items()})
    assert alone.abs().sum() > 0
    # the loss is a mean over 8 rows: only row k's gradient remains, divided by 8
    torch.testing.assert_close(weighted * 8, alone, rtol=1e-4, atol=1e-6)
    # and a weight scales its row: 2.5 on row k gives 2.5 times that gradient
    scaled = first_loss_grads(algo, replace(batch, weights=one_hot * 2.5), noise)
    torch.testing.assert_close(scaled, 2.5 * weighted, rtol=1e-4, atol=1e-6)


def test_polyak_update_matches_the_formula():
    from corral.algos.offpolicy import OffPolicy

    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    expected = [0.9 * t.detach() + 0.1 * o.detach() for t, o in zip(target.parameters(), online.parameters())]
    OffPolicy.polyak(target, online, 0.1)
    for e, t in zip(expected, target.parameters()):
        assert torch.allclose(e, t)


@pytest.mark.parametrize("algo_name, env_id", [("qrdqn", "CartPole-v1"), ("iqn", "CartPole-v1"),
                                               ("sac", "Pendulum-v1"), ("crossq", "Pendulum-v1")])
def test_adam_eps_reaches_every_optimizer_and_scales_the_first_step(algo_name, env_id):
    # adam_eps is torch's 1e-8 unless set; sb3-contrib's QR-DQN uses 0.01 / batch_size
    assert make(algo_name, env_id).cfg.adam_eps == 1e-8
    algo = make(algo_name, env_id, adam_eps=1e-3)
    opts = [getattr(algo, name) for name in algo.optimizers]
    assert opts and all(o.eps == 1e-3 for o in opts)
    # Adam's first step is lr * g / (|g| + eps): eps = |g| halves it
    p = torch.nn.Parameter(torch.zeros(1))
    opt = type(opts[0])([p], lr=1.0, eps=0.5)
    opt.zero_grad()
    (0.5 * p).sum().backward()
    opt.step()
    assert p.item() == pytest.approx(-0.5, rel=1e-5)


def test_a_replay_that_cannot_fit_fails_before_training_with_the_numbers(tmp_path, capsys):
    rc = main(["train", "sac", "Pendulum-v1", "--steps", "100", "--run-dir", str(tmp_path / "r"),
               "--set", "sac.buffer_size=100000000000"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "100000000000" in err.replace(",", "") and "free" in err and "buffer_size" in err
    assert not (tmp_path / "r").exists()


def test_batch_larger_than_what_is_stored_waits_instead_of_crashing():
    algo = make("sac", learning_starts=0, batch_size=64, hidden=(16,))
    fill(algo, 10, 3, None)
    assert not algo.ready()
    fill(algo, 60, 3, None)
    assert algo.ready()


def test_non_finite_td_errors_stop_the_run_with_an_intact_checkpoint(tmp_path, capsys):
    # Rewards of 3e38 are finite, but a 3-step return of them overflows float32 to inf.
    rc = main(["train", "per_dqn", "envs_for_tests:BlowUpEnv", "--steps", "3000", "--run-dir", str(tmp_path / "r"),
               "--set", "env.kwargs.after=1200", "--set", "checkpoint.every=500", "--set", "per_dqn.n_step=3", *QUIET, *sum((["--set", kv] for kv in tiny("per_dqn")), [])])
    err = capsys.readouterr().err
    assert rc == 1 and "non-finite" in err
    agent = corral.load(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert all(torch.isfinite(p).all() for p in agent.actor.parameters())


FAST_SAC = ["sac.learning_starts=100", "sac.batch_size=64", "sac.hidden=[32, 32]", "eval.episodes=0",
            "progress=false", "tensorboard=false", "sac.normalize_obs=true"]


def test_off_policy_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    n = 400
    a = Learner(build_config("sac", "Pendulum-v1", steps=2 * n, seed=3, sets=FAST_SAC), None)
    a.train()
    assert main(["train", "sac", "Pendulum-v1", "--steps", str(n), "--seed", "3", "--run-dir", str(tmp_path / "b"),
                 *sum((["--set", s] for s in FAST_SAC), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for name in ("actor", "critics", "critics_target"):
        pa = torch.cat([p.flatten() for p in getattr(a.algo, name).state_dict().values()])
        pb = torch.cat([p.flatten() for p in getattr(b.algo, name).state_dict().values()])
        assert torch.equal(pa, pb), name
    assert torch.equal(a.algo.log_alpha, b.algo.log_alpha)


EVAL_SNIPPET = """
import json, sys, corral
agent = corral.load(sys.argv[1])
print(json.dumps(corral.evaluate(agent, "Pendulum-v1", episodes=3, seed=11)))
"""


def test_sac_resumed_in_a_fresh_process_acts_the_same_and_keeps_learning(tmp_path):
    """The failure users of other frameworks report: resume collapses. Here the deterministic eval
    before save and after load in a new process match, and training continues without a drop."""
    rd = tmp_path / "r"
    sets = ["sac.learning_starts=200", "sac.batch_size=128", "sac.hidden=[64, 64]", "sac.lr=0.001",
            "eval.episodes=3", "progress=false", "tensorboard=false"]
    assert main(["train", "sac", "Pendulum-v1", "--steps", "4000", "--seed", "0", "--run-dir", str(rd),
                 *sum((["--set", s] for s in sets), [])]) == 0
    ckpt = rd / "checkpoints" / "latest.pt"
    agent = corral.load(ckpt)
    before = corral.evaluate(agent, "Pendulum-v1", episodes=3, seed=11)
    proc = subprocess.run([sys.executable, "-c", EVAL_SNIPPET, str(ckpt)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}, timeout=120)
    after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert after["mean_return"] == pytest.approx(before["mean_return"], abs=1e-6)
    assert main(["resume", str(rd), "--steps", "5000"]) == 0
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_return"] for r in rows if "eval_return" in r]
    # the eval after 1000 more steps is no worse than before resume (minus noise of 3 episodes)
    assert evals[-1] >= evals[-2] - 150, evals


@pytest.mark.parametrize("final,expect_end", [(1.0, 1.0), (0.4, 0.4)])
def test_per_beta_anneals_to_its_configured_end(final, expect_end):
    from corral.schemes.replay_server import ReplayServer

    over = {"dqn.prioritized": True, "dqn.per_beta": 0.4, "dqn.per_beta_final": final, "tensorboard": False,
            "eval.episodes": 0}
    L = Learner(build_config("dqn", "CartPole-v1", steps=1000, overrides=over), None, quiet=True)
    server = ReplayServer(L.algo.cfg, 1, L.algo.obs_space, L.algo.act_space, seed=0)
    for buf in (L.algo.replay, server.buffer):
        buf.beta_steps = 100
        buf.step = 0
        assert buf.beta == pytest.approx(0.4)
        buf.step = 50
        assert buf.beta == pytest.approx(0.4 + 0.5 * (expect_end - 0.4))
        buf.step = 100
        assert buf.beta == pytest.approx(expect_end)


def test_squashed_gaussian_fused_log_prob_gradient_matches_autograd():
    # the actor loss's sample goes through _Squash (closed-form gradient); the reference is
    # the same math through autograd, including log stds outside the clamp
    from corral.actors.offpolicy import LOG_STD_MAX, LOG_STD_MIN, _Squash, squashed_sample

    g = torch.Generator().manual_seed(0)
    out = torch.randn(64, 6, generator=g, dtype=torch.double) * 2
    out[0, 3], out[1, 4] = LOG_STD_MIN - 5, LOG_STD_MAX + 1
    noise = torch.randn(64, 3, generator=g, dtype=torch.double)
    up_a, up_l = torch.randn(64, 3, generator=g, dtype=torch.double), torch.randn(64, generator=g, dtype=torch.double)
    for use in ("both", "action", "logp"):
        x1, x2 = out.clone().requires_grad_(), out.clone().requires_grad_()
        a1, l1 = _Squash.apply(x1, noise)
        a2, l2, _, _ = squashed_sample(*x2.chunk(2, -1), noise)
        assert torch.equal(a1, a2) and torch.equal(l1, l2)
        loss1 = (a1 * up_a).sum() * (use != "logp") + (l1 * up_l).sum() * (use != "action")
        loss2 = (a2 * up_a).sum() * (use != "logp") + (l2 * up_l).sum() * (use != "action")
        (g1,), (g2,) = torch.autograd.grad(loss1, [x1]), torch.autograd.grad(loss2, [x2])
        assert torch.allclose(g1, g2, atol=1e-10), (use, (g1 - g2).abs().max())
        assert g1[0, 3] == 0 and g1[1, 4] == 0  # clamped log stds pass no gradient



KEEP_HEAP_PROBE = """
import ctypes, resource, sys
from corral.train.learner import Learner
from corral.train.setup import build_config

Learner(build_config("sac", "Pendulum-v1", steps=1000, seed=0,
                     sets=[f"keep_heap={sys.argv[1]}", "progress=false", "tensorboard=false"]), None)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def step():  # 32 blocks of 512 KiB (SAC's [2, 256, 256] activations), written, freed
    blocks = [libc.malloc(1 << 19) for _ in range(32)]
    for b in blocks:
        libc.memset(b, 1, 1 << 19)
    for b in reversed(blocks):
        libc.free(b)


step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_heap_stops_each_step_page_faulting_its_activations_afresh():
    """With ``keep_heap`` (the default) memory freed at the end of a gradient step is reused by
    the next: no page faults. glibc's defaults give the heap's top back to the OS once more
    than ~2x the largest freed block is free, so every step faults most of its 16 MiB in again (4096
    pages). Each case in its own process: the setting is process-wide."""
    def faults(flag):
        out = subprocess.run([sys.executable, "-c", KEEP_HEAP_PROBE, flag], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        return float(out.stdout.strip().splitlines()[-1])

    assert faults("true") < 10
    assert faults("false") > 1000



def test_a_linear_lr_schedule_anneals_every_optimizer_from_its_built_rate_also_after_a_resume():
    """``lr_schedule=linear`` (rl-zoo's lin_X on a replay algorithm): each optimizer's rate is its
    built rate times (1 - progress) at every update, the actor's own ``actor_lr`` included; a
    resumed algorithm anneals from the config's rates, and a rate set from outside (PBT) becomes
    the base. Constant: the rates never move; a schedule is refused the CUDA graph."""
    from corral.algos.graphed import refusal

    opts = dict(lr=1e-3, actor_lr=4e-4, lr_schedule="linear", learning_starts=0, batch_size=8)
    a = make("sac", **opts)
    built = [opt.lr for opt in a.declared_optimizers()]
    assert sorted(set(built)) == [4e-4, 1e-3]
    fill(a, 32, 3, None)
    a.update(0.5)
    assert [opt.lr for opt in a.declared_optimizers()] == pytest.approx([x * 0.5 for x in built])
    b = make("sac", **opts)
    b.load_state_dict(a.state_dict())
    assert [opt.lr for opt in b.declared_optimizers()] == built  # a resume keeps the config's rates
    fill(b, 32, 3, None)
    b.update(0.75)
    assert [opt.lr for opt in b.declared_optimizers()] == pytest.approx([x * 0.25 for x in built])
    b.critic_opt.lr = 2e-3  # a rate set from outside (PBT's explore)
    b.update(0.5)
    assert 1e-3 in [opt.lr for opt in b.declared_optimizers()]  # 2e-3 annealed to half
    c = make("sac", lr=1e-3, actor_lr=4e-4, learning_starts=0, batch_size=8)
    fill(c, 32, 3, None)
    c.update(0.9)
    assert [opt.lr for opt in c.declared_optimizers()] == built
    assert "learning-rate schedule" in refusal(a) and refusal(c) is None
