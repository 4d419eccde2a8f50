"""SAC for discrete actions: the critic target, actor and temperature losses against hand
computations, gradient isolation (vectors and pixels), acting, exact resume, the CLI,
gradient workers, and a learning threshold on CartPole."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_grad_workers_offpolicy import assert_same_state, filled, twin
from test_offpolicy import fill, make, make_on, phase_grads

import corral
from corral.algos.base import Step
from corral.algos.sac_discrete import SACDiscrete
from corral.cli import main
from corral.errors import UserError
from corral.schemes.grad import LocalGradPool, ShardedOffPolicy, sharded_class
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}
TINY = ["sac_discrete.learning_starts=64", "sac_discrete.batch_size=32", "sac_discrete.hidden=[32]"]


def sets(items):
    return [x for s in items for x in ("--set", s)]


# ---------------------------------------------------------------------------
# the losses against hand computations


def test_the_critic_target_is_the_soft_value_of_the_next_state_under_the_policy():
    # two transitions, two actions; pi(s') = (1/4, 3/4) and (1/2, 1/2), min_i Q_targ_i(s', .) given
    log_pi = torch.tensor([[0.25, 0.75], [0.5, 0.5]]).log()
    next_q = torch.tensor([[1.0, 2.0], [4.0, 0.0]])
    reward, discount = torch.tensor([1.0, -1.0]), torch.tensor([0.9, 0.0])  # the second terminated
    target = SACDiscrete.soft_target(log_pi, next_q, reward, discount, torch.tensor(0.5))
    v0 = 0.25 * (1.0 - 0.5 * math.log(0.25)) + 0.75 * (2.0 - 0.5 * math.log(0.75))  # = 2.031168
    torch.testing.assert_close(target, torch.tensor([1.0 + 0.9 * v0, -1.0]))
    assert target[0].item() == pytest.approx(2.828051, abs=1e-6)


def test_the_actor_loss_is_the_policy_expectation_of_alpha_log_pi_minus_q():
    log_pi = torch.tensor([[0.25, 0.75], [0.5, 0.5]]).log().requires_grad_()
    q = torch.tensor([[1.0, 2.0], [4.0, 0.0]])
    loss = SACDiscrete.actor_loss(log_pi, q, torch.tensor(0.5))
    row0 = 0.25 * (0.5 * math.log(0.25) - 1.0) + 0.75 * (0.5 * math.log(0.75) - 2.0)
    row1 = 0.5 * (0.5 * math.log(0.5) - 4.0) + 0.5 * (0.5 * math.log(0.5) - 0.0)
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    # d/d log pi_a of pi_a (alpha log pi_a - q_a) = pi_a (alpha log pi_a - q_a + alpha), over 2 rows
    (g,) = torch.autograd.grad(loss, log_pi)
    pi = log_pi.detach().exp()
    torch.testing.assert_close(g, pi * (0.5 * log_pi.detach() - q + 0.5) / 2)


def test_the_temperature_loss_moves_alpha_toward_the_entropy_target():
    algo = make("sac_discrete", "CartPole-v1", hidden=(16,), ent_coef_init=0.5)
    assert algo.target_entropy == pytest.approx(0.5 * math.log(2))  # the default ratio of log|A|
    entropy = torch.tensor([-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)])  # 0.5623, 0.6931
    loss = algo.temperature_loss(entropy)
    mean_gap = (0.562335 + 0.693147) / 2 - 0.346574
    assert loss.item() == pytest.approx(math.log(0.5) * mean_gap, abs=1e-5)
    (g,) = torch.autograd.grad(loss, algo.log_alpha)
    assert g.item() == pytest.approx(mean_gap, abs=1e-5)  # > 0: entropy above target, alpha falls


def test_target_entropy_is_a_ratio_of_log_actions_unless_given_in_nats():
    box = gym.spaces.Box(-1, 1, (3,))
    for n in (2, 3, 18):
        assert make_on("sac_discrete", box, gym.spaces.Discrete(n)).target_entropy == pytest.approx(0.5 * math.log(n))
    a = make_on("sac_discrete", box, gym.spaces.Discrete(6), target_entropy_ratio=0.98)
    assert a.target_entropy == pytest.approx(0.98 * math.log(6))
    assert make_on("sac_discrete", box, gym.spaces.Discrete(6), target_entropy=0.1).target_entropy == 0.1


def perturbed_targets(algo):
    g = torch.Generator().manual_seed(0)  # its own stream: the global one differs from process to process
    with torch.no_grad():  # target critics apart from the online ones, and apart from each other
        for p in algo.critics_target.parameters():
            p.mul_(0.5).add_(0.3 * torch.randn(p.shape, generator=g))


def test_a_gradient_step_computes_the_three_losses_of_the_paper():
    algo = make("sac_discrete", "CartPole-v1", learning_starts=0, batch_size=16, hidden=(16,), ent_coef_init=0.3,
                lr=1e-2)
    fill(algo, 40, 4, None)
    perturbed_targets(algo)
    batch = algo.replay.sample(16)
    alpha = 0.3
    with torch.no_grad():
        log_pi_next = algo.actor(batch.next_obs)
        qt = algo.critics_target(batch.next_obs)  # [2, B, A]
        assert (qt[0] != qt[1]).any()
        soft = (log_pi_next.exp() * (torch.minimum(qt[0], qt[1]) - alpha * log_pi_next)).sum(-1)
        target = batch.reward + batch.discount * soft
        q = algo.critics(batch.obs)[:, torch.arange(16), batch.action]
        critic_expected = 0.5 * ((q[0] - target).square().mean() + (q[1] - target).square().mean())
    steps = algo.phases(batch, algo.draw_noise(16))
    opt, critic_loss = next(steps)
    assert opt is algo.critic_opt
    assert critic_loss.item() == pytest.approx(critic_expected.item(), rel=1e-5, abs=1e-7)
    opt.zero_grad()
    critic_loss.backward()
    opt.step()
    opt, actor_loss = steps.send(None)
    assert opt is algo.actor_opt
    with torch.no_grad():  # with the critics as the critic step left them
        log_pi = algo.actor(batch.obs)
        qmin = algo.critics(batch.obs).min(0).values
        actor_expected = (log_pi.exp() * (alpha * log_pi - qmin)).sum(-1).mean()
        entropy = -(log_pi.exp() * log_pi).sum(-1)
    assert actor_loss.item() == pytest.approx(actor_expected.item(), rel=1e-5, abs=1e-7)
    opt.zero_grad()
    actor_loss.backward()
    opt.step()
    opt, alpha_loss = steps.send(None)
    assert opt is algo.alpha_opt
    expected = math.log(alpha) * (entropy.mean().item() - 0.5 * math.log(2))
    assert alpha_loss.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    stats, td = done.value.value
    assert td is None and {"critic_loss", "q_mean", "alpha", "actor_loss", "entropy"} <= stats.keys()
    assert stats["entropy"].item() == pytest.approx(entropy.mean().item(), rel=1e-5)


def test_a_fixed_ent_coef_has_no_temperature_phase_and_keeps_alpha():
    algo = make("sac_discrete", "CartPole-v1", learning_starts=0, batch_size=16, hidden=(16,), ent_coef=0.05)
    assert algo.alpha_opt is None and not algo.log_alpha.requires_grad
    fill(algo, 40, 4, None)
    for _ in range(3):
        stats, _ = algo.train_step(algo.replay.sample(16))
    assert stats["alpha"].item() == pytest.approx(0.05)
    assert [name for name, _, _ in phase_grads(algo, algo.replay.sample(16))] == ["critic_opt", "actor_opt"]


@pytest.mark.parametrize("target", [10.0, 0.0])
def test_the_temperature_rises_below_the_entropy_target_and_falls_above_it(target):
    algo = make("sac_discrete", "CartPole-v1", learning_starts=0, batch_size=16, hidden=(16,), target_entropy=target)
    fill(algo, 40, 4, None)
    before = algo.log_alpha.item()
    algo.train_step(algo.replay.sample(16))
    # any policy's entropy lies in [0, log 2]: 10 is above it, 0 below a near-uniform start
    assert (algo.log_alpha.item() > before) == (target == 10.0)


# ---------------------------------------------------------------------------
# gradient isolation


def test_each_loss_reaches_and_moves_only_its_own_parameters():
    # every learning rate nonzero: a loss that leaked gradient into another network would move it
    algo = make("sac_discrete", "CartPole-v1", learning_starts=0, batch_size=16, hidden=(16,), lr=1e-2,
                normalize_obs=True)
    fill(algo, 40, 4, None)
    targets = [p.clone() for p in algo.critics_target.parameters()]
    norm = algo.actor.enc.norm.state_dict()
    phases = phase_grads(algo, algo.replay.sample(16))
    assert phases == [("critic_opt", {"critics"}, {"critics"}), ("actor_opt", {"actor"}, {"actor"}),
                      ("alpha_opt", {"log_alpha"}, {"log_alpha"})]
    # the target critics move only by Polyak (after_step), the normalizer only in observe
    assert all(torch.equal(a, b) for a, b in zip(targets, algo.critics_target.parameters()))
    assert all(torch.equal(v, algo.actor.enc.norm.state_dict()[k]) for k, v in norm.items())
    algo.after_step({})
    assert any(not torch.equal(a, b) for a, b in zip(targets, algo.critics_target.parameters()))


class PixelQuarter(gym.Env):
    """One-step episodes: a bright column in one of four quarters of a 36x36 frame; reward 1
    for the action that names the quarter. Only a policy that reads the pixels scores
    above 0.25."""

    observation_space = gym.spaces.Box(0, 255, (1, 36, 36), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.col = int(self.np_random.integers(0, 36))
        frame = np.zeros((1, 36, 36), np.uint8)
        frame[0, :, self.col] = 255
        return frame, {}

    def step(self, action):
        return np.zeros((1, 36, 36), np.uint8), float(int(action) == self.col // 9), True, False, {}


class PixelQuarterDict(PixelQuarter):
    observation_space = gym.spaces.Dict({"frame": PixelQuarter.observation_space,
                                         "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def reset(self, seed=None, options=None):
        frame, info = super().reset(seed=seed)
        return {"frame": frame, "vec": np.zeros(2, np.float32)}, info

    def step(self, action):
        frame, r, term, trunc, info = super().step(action)
        return {"frame": frame, "vec": np.ones(2, np.float32)}, r, term, trunc, info


def pixel_learner(env, **over):
    cfg = build_config("sac_discrete", env, steps=2000, seed=0,
                       overrides={**QUIET, "sac_discrete.hidden": [64], "sac_discrete.batch_size": 32,
                                  "sac_discrete.learning_starts": 64, **over})
    return Learner(cfg, None, env_spec=env, quiet=True)


def grads_of(enc):
    return [p.grad.abs().sum().item() if p.grad is not None else 0.0 for p in enc.parameters()]


@pytest.mark.parametrize("env", [PixelQuarter, PixelQuarterDict])
def test_on_pixels_the_actor_and_the_critics_each_train_their_own_cnn(env):
    L = pixel_learner(env)
    a = L.algo
    if env is PixelQuarter:
        assert a.replay.obs_dtype == torch.uint8  # pixels stay bytes in the replay
        assert a.actor.enc.cnn is not None and a.critics.enc.cnn is not None
    else:  # a Dict: the image part through a CNN of each encoder's own, the vector part as it is
        assert len(a.actor.enc.parts.cnns) == len(a.critics.enc.parts.cnns) == 1
        assert a.actor.enc.dim == a.critics.enc.dim == 512 + 2
    assert {id(p) for p in a.actor.parameters()}.isdisjoint(id(p) for p in a.critics.parameters())
    obs = L.obs
    with torch.no_grad():
        for _ in range(80):
            act, ex = a.explore(obs)
            nxt, r, te, tr, info = L.env.step(act)
            a.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    phases = a.phases(a.replay.sample(16), a.draw_noise(16))
    opt, critic_loss = next(phases)
    for o in a.declared_optimizers():
        o.zero_grad()
    critic_loss.backward()
    assert all(g > 0 for g in grads_of(a.critics.enc)) and not any(g > 0 for g in grads_of(a.actor.enc))
    opt.step()
    opt, actor_loss = phases.send(None)
    for o in a.declared_optimizers():
        o.zero_grad()
    actor_loss.backward()
    assert all(g > 0 for g in grads_of(a.actor.enc)) and not any(g > 0 for g in grads_of(a.critics.enc))
    phases.close()


def test_sac_discrete_learns_to_read_the_pixels():
    agent = corral.train("sac_discrete", PixelQuarter, steps=600, seed=0, save_run=False,
                         **{**QUIET, "sac_discrete.hidden": [64], "sac_discrete.batch_size": 32,
                            "sac_discrete.learning_starts": 200, "sac_discrete.lr": 1e-3})
    ret = corral.evaluate(agent, PixelQuarter, episodes=100, seed=1)["mean_return"]
    assert ret >= 0.8, ret  # a constant action scores 0.25 (seeds 0 and 1 score 1.0)


# ---------------------------------------------------------------------------
# acting


def test_acting_samples_the_policy_from_its_own_stream_and_deterministic_act_is_the_argmax():
    algo = make("sac_discrete", "CartPole-v1", hidden=(16,), learning_starts=0)
    with torch.no_grad():
        algo.actor.net[-1].weight.zero_()
        algo.actor.net[-1].bias.copy_(torch.tensor([0.0, math.log(3.0)]))  # pi = (1/4, 3/4) everywhere
    obs = torch.randn(8000, 4, generator=torch.Generator().manual_seed(0))
    noise_state = algo.rng["noise"].get_state()
    with torch.no_grad():
        action, extras = algo.explore(obs)
    assert torch.equal(extras.action, action) and action.dtype == torch.long
    assert abs(action.float().mean().item() - 0.75) < 0.02  # 8000 draws: 0.02 is 4 sigma
    assert torch.equal(algo.rng["noise"].get_state(), noise_state)  # sampling uses the action stream
    assert torch.equal(algo.act(obs[:100]), torch.ones(100, dtype=torch.long))
    # and sampling is the inverse CDF of one uniform per row: reproducible from the stream
    g = torch.Generator().manual_seed(3)
    u = torch.rand(100, 1, generator=torch.Generator().manual_seed(3))
    drawn = algo.actor.sample(algo.actor(obs[:100]), g)
    assert torch.equal(drawn, (u > 0.25).long().squeeze(1))


def test_before_learning_starts_actions_are_uniform():
    algo = make("sac_discrete", "Acrobot-v1", hidden=(16,), learning_starts=10_000)
    with torch.no_grad():
        algo.actor.net[-1].bias.copy_(torch.tensor([50.0, 0.0, 0.0]))  # a policy that always picks 0
        action, _ = algo.explore(torch.randn(6000, 6))
    counts = torch.bincount(action, minlength=3).float() / 6000
    assert (counts - 1 / 3).abs().max() < 0.025


def test_a_box_action_space_is_refused_with_the_algorithm_to_use():
    with pytest.raises(UserError, match="Discrete action space.*use sac"):
        make("sac_discrete", "Pendulum-v1")


def test_declarations_cover_the_state_and_an_acting_copy_acts_like_the_learner():
    full = make("sac_discrete", "CartPole-v1", hidden=(16,))
    state = full.state_dict()
    assert {"actor", "critics", "critics_target", "log_alpha", "actor_opt", "critic_opt", "alpha_opt"} <= set(state)
    with torch.no_grad():
        for p in full.actor.parameters():
            p.add_(0.1)
    env = gym.make("CartPole-v1")
    spec = corral.algos.get_algo("sac_discrete")
    copy = spec.cls(full.cfg, env.observation_space, env.action_space, 1, torch.device("cpu"), full.rng,
                    role="actor")
    assert copy.declared_optimizers() == [] and copy.replay is None
    copy.load_state_dict(full.state_dict())
    obs = torch.randn(32, 4)
    assert torch.equal(copy.act(obs), full.act(obs))


# ---------------------------------------------------------------------------
# the CLI, exact resume, gradient workers


def test_sac_discrete_runs_through_the_cli_on_vector_envs(tmp_path, capsys):
    args = ["train", "sac_discrete", "CartPole-v1", "--steps", "400", "--num-envs", "2", "--run-dir",
            str(tmp_path / "r"), "--json", "--set", "tensorboard=false", "--set", "eval.episodes=1", *sets(TINY)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 400
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any({"critic_loss", "actor_loss", "entropy", "alpha", "q_mean"} <= r.keys() for r in rows)
    assert main(["eval", str(tmp_path / "r"), "--episodes", "2", "--json"]) == 0


FAST = ["sac_discrete.learning_starts=100", "sac_discrete.batch_size=64", "sac_discrete.hidden=[32, 32]",
        "sac_discrete.n_step=3", "sac_discrete.normalize_obs=true", "sac_discrete.train_freq=2", "env.num_envs=2",
        "eval.episodes=0", "progress=false", "tensorboard=false"]


def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    n = 400
    a = Learner(build_config("sac_discrete", "CartPole-v1", steps=2 * n, seed=3, sets=FAST), None)
    a.train()
    assert main(["train", "sac_discrete", "CartPole-v1", "--steps", str(n), "--seed", "3", "--run-dir",
                 str(tmp_path / "b"), *sets(FAST)]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    assert a.algo.grad_steps > n // 2  # both halves trained
    for name in ("actor", "critics", "critics_target"):
        pa = torch.cat([p.flatten() for p in getattr(a.algo, name).state_dict().values()])
        pb = torch.cat([p.flatten() for p in getattr(b.algo, name).state_dict().values()])
        assert torch.equal(pa, pb), name
    assert torch.equal(a.algo.log_alpha, b.algo.log_alpha)
    assert a.algo.log_alpha.item() != 0.0  # the temperature was tuned along the way


def test_sync_gradient_workers_give_the_single_process_updates():
    # critics, actor, temperature: three optimizers a step; n-step PER, normalized obs, delayed actor
    L = filled("sac_discrete", "CartPole-v1", {"sac_discrete.gradient_steps": 4, "sac_discrete.hidden": [32, 32],
                                               "sac_discrete.normalize_obs": True, "sac_discrete.prioritized": True,
                                               "sac_discrete.n_step": 3, "sac_discrete.policy_delay": 2})
    plain = twin(L, type(L.algo))
    sharded = twin(L, sharded_class(L.algo))
    assert isinstance(sharded, ShardedOffPolicy) and sharded.name == "sac_discrete"
    sharded.attach(LocalGradPool(L.cfg, 3, plain.obs_space, plain.act_space), "sync")
    for _ in range(3):
        s1, s2 = plain.update(0.5), sharded.update(0.5)
        assert s1.keys() == s2.keys() and "actor_loss" in s1
        for k in s1:
            assert s2[k] == pytest.approx(s1[k], rel=1e-4, abs=1e-6), k
    assert plain.grad_steps == sharded.grad_steps == 12
    assert plain.alpha_opt.steps == sharded.alpha_opt.steps == 6  # every second step
    assert_same_state(plain, sharded, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(sharded.replay.priorities, plain.replay.priorities, rtol=2e-5, atol=2e-6)
    moved = [not torch.equal(x, y) for x, y in zip(plain.synced_tensors(), twin(L, type(L.algo)).synced_tensors())]
    assert any(moved)


def test_two_ray_gradient_workers_train_like_one_process():
    pytest.importorskip("ray")
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    over = {**QUIET, "sac_discrete.hidden": [32, 32], "sac_discrete.learning_starts": 200,
            "sac_discrete.batch_size": 64}
    runs, init = [], None
    for workers in (1, 2):
        cfg = build_config("sac_discrete", "CartPole-v1", steps=400, seed=3,
                           overrides={**over, "scheme.grad_workers": workers})
        L = Learner(cfg, None, env_spec="CartPole-v1", quiet=True)
        init = init or [t.clone() for t in L.algo.synced_tensors()]
        assert L.train()["env_steps"] == 400
        runs.append(L.algo)
    plain, sharded = runs
    # the preset trains every 4 steps, 4 gradient steps each: 51 updates from step 200 to 400
    assert isinstance(sharded, ShardedOffPolicy) and plain.grad_steps == sharded.grad_steps == 204
    # float rounding apart (training amplifies it a little), far less than the parameters moved
    moved = max((p - i).abs().max().item() for p, i in zip(plain.synced_tensors(), init))
    apart = max((p - s).abs().max().item() for p, s in zip(plain.synced_tensors(), sharded.synced_tensors()))
    assert moved > 0.02 and apart < 0.01 * moved, (moved, apart)


def test_a_gradient_worker_builds_networks_and_optimizers_only():
    env = gym.make("CartPole-v1")
    spec = corral.algos.get_algo("sac_discrete")
    w = spec.cls(spec.cls.Config(), env.observation_space, env.action_space, 1, torch.device("cpu"),
                 corral.rng.RNGStreams(0), role="grad_worker")
    assert w.replay is None and len(w.declared_optimizers()) == 3


# ---------------------------------------------------------------------------
# learning


def test_sac_discrete_reaches_400_on_cartpole_within_50k_steps():
    agent = corral.train("sac_discrete", "CartPole-v1", seed=0, save_run=False, **QUIET)
    assert agent.cfg.steps <= 50_000
    result = corral.evaluate(agent, "CartPole-v1", episodes=20, seed=123)
    assert result["mean_return"] >= 400, result
