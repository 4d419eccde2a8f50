"""gSDE (generalized State-Dependent Exploration: corral/nets/sde.py, actors/sde.py, algos/sde.py):
the distribution against torch.distributions, the exploration matrices' cadence, gradient
isolation, exact resume, the CLI, rl-zoo's entries and a learning test."""

import importlib.util
import math

import gymnasium as gym
import pytest
import torch
from torch.distributions import Normal

import corral
from corral.actors.sde import SDEActorCritic, SDESquashedGaussianActor
from corral.algos import get_algo
from corral.algos.base import Step
from corral.algos.offpolicy import drive
from corral.algos.sde import SDEExploration
from corral.cli import main
from corral.nets.sde import StateDependentNoise
from corral.rng import RNGStreams
from corral.train.learner import Learner
from corral.train.setup import build_config

HAVE_ZOO = importlib.util.find_spec("rl_zoo3") is not None
QUIET = ["--set", "tensorboard=false", "--set", "progress=false", "--set", "eval.episodes=1"]
BOX3, BOX2 = gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(-2.0, 2.0, (2,))


def head(L=5, A=3, full_std=True, use_expln=False):
    torch.manual_seed(0)
    h = StateDependentNoise(L, A, log_std_init=-0.3, full_std=full_std, use_expln=use_expln)
    with torch.no_grad():  # entries on both sides of 0 (expln's two branches)
        h.log_std.add_(torch.randn_like(h.log_std) * 0.7)
    return h


def sigma_of(h):
    """sigma written out from the definition (SB3's get_std), ``[L, A]``."""
    ls = h.log_std.detach()
    s = torch.where(ls > 0, torch.log1p(ls.clamp(min=0)) + 1, ls.exp()) if h.use_expln else ls.exp()
    return s.expand(h.latent_dim, h.act_dim)


# --- the distribution


@pytest.mark.parametrize("full_std,use_expln", [(True, False), (False, False), (True, True), (False, True)])
def test_log_prob_and_entropy_are_a_normal_with_variance_phi_squared_at_sigma_squared(full_std, use_expln):
    h = head(full_std=full_std, use_expln=use_expln)
    assert h.log_std.shape == ((5, 3) if full_std else (5, 1))
    g = torch.Generator().manual_seed(1)
    phi, mean, action = (torch.randn(7, d, generator=g) for d in (5, 3, 3))
    sigma = sigma_of(h)
    # per action dim j: var_j = sum_i phi_i^2 sigma_ij^2, written as a loop
    var = torch.stack([sum(phi[:, i] ** 2 * sigma[i, j] ** 2 for i in range(5)) for j in range(3)], -1)
    dist = Normal(mean, (var + 1e-6).sqrt())
    params = h.params(mean, phi)
    assert torch.allclose(h.log_prob(params, action), dist.log_prob(action).sum(-1), atol=1e-5)
    assert torch.allclose(h.entropy(params), dist.entropy().sum(-1), atol=1e-5)
    assert torch.equal(h.mode(params), mean)


def test_expln_is_exp_below_zero_and_log1p_plus_one_above():
    h = StateDependentNoise(3, 2, full_std=False, use_expln=True)
    with torch.no_grad():
        h.log_std.copy_(torch.tensor([[-1.0], [0.0], [2.0]]))
    expected = torch.tensor([math.exp(-1.0), 1.0, math.log(3.0) + 1.0])
    assert torch.allclose(h.std(), expected[:, None].expand(3, 2))  # one sigma per feature, shared by actions
    with torch.no_grad():
        h.use_expln = False
        assert torch.allclose(h.std()[:, 0], torch.tensor([-1.0, 0.0, 2.0]).exp())


def test_the_noise_phi_at_theta_has_the_state_dependent_variance_and_mean_zero():
    h = head(L=4, A=2)
    g = torch.Generator().manual_seed(2)
    phi = torch.randn(3, 4, generator=g)
    n = 40_000
    z = h.draw(n, g)  # a matrix per draw: one sample of the noise per state per draw
    expected = phi.square() @ sigma_of(h).square()
    for b in range(3):
        with torch.no_grad():
            eps = h.noise(phi[b].expand(n, 4), z)
        assert torch.allclose(eps.var(0), expected[b], rtol=0.04)
        assert (eps.mean(0).abs() < 4 * (expected[b] / n).sqrt()).all()


def test_one_matrix_for_every_row_is_the_same_as_that_matrix_given_to_each_row():
    h = head(L=4, A=2)
    g = torch.Generator().manual_seed(3)
    phi = torch.randn(6, 4, generator=g, requires_grad=True)
    z = h.draw(None, g)
    shared = h.noise(phi, z)
    assert torch.equal(shared, h.noise(phi, z.expand(6, 4, 2)))  # an expanded view is read as the one matrix
    assert torch.allclose(shared, h.noise(phi, z.expand(6, 4, 2).clone()), atol=1e-6)  # one per row (bmm)
    assert torch.allclose(shared, phi.detach() @ (sigma_of(h) * z), atol=1e-6)
    # phi is detached (learn_features=False); sigma gets the gradient through theta = sigma * z
    shared.sum().backward()
    assert phi.grad is None and h.log_std.grad.abs().sum() > 0


def test_the_squashed_actor_is_the_gaussian_with_the_tanh_correction_and_a_clipped_mean():
    torch.manual_seed(0)
    actor = SDESquashedGaussianActor(BOX3, BOX2, hidden=(8,), log_std_init=-1.0)
    with torch.no_grad():
        actor.mu.weight.mul_(20)  # some means beyond the clip at 2
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(4)) * 3
    z = actor.sde.draw(None, torch.Generator().manual_seed(5))
    action, logp = actor(x, noise=z)
    with torch.no_grad():
        phi = actor.net(x)
        raw = actor.mu(phi)
        mean = raw.clamp(-2.0, 2.0)
        assert (raw.abs() > 2).any()
        pre = mean + phi @ (actor.sde.log_std.exp() * z)
        std = (phi.square() @ actor.sde.log_std.exp().square() + 1e-6).sqrt()
        expected = Normal(mean, std).log_prob(pre).sum(-1) - torch.log(1 - torch.tanh(pre) ** 2).sum(-1)
    assert torch.allclose(action, torch.tanh(pre), atol=1e-6)
    ok = (pre.abs() < 5).all(-1)  # where float32's 1 - tanh^2 still has digits to compare
    assert torch.allclose(logp[ok], expected[ok], atol=1e-3)
    assert torch.equal(actor(x, deterministic=True)[0], torch.tanh(mean))


def test_the_actor_critic_explores_mean_plus_phi_theta_and_scores_it_as_evaluate_actions_does():
    torch.manual_seed(0)
    ac = SDEActorCritic(BOX3, BOX2, hidden=(8, 8), normalize_obs=False, log_std_init=-1.0)
    obs = torch.randn(4, 3)
    z = ac.head.draw(4, torch.Generator().manual_seed(6))
    with torch.no_grad():
        env_a, a, logp, v, x = ac.explore(obs, noise=z)
        phi = ac.body(x)[0]
        mean = ac.action_net(phi)
        expected = mean + torch.bmm(phi.unsqueeze(1), ac.head.log_std.exp() * z).squeeze(1)
        lp, ent, v2 = ac.evaluate_actions(x, a)
        std = (phi.square() @ ac.head.log_std.exp().square() + 1e-6).sqrt()
    assert torch.allclose(a, expected, atol=1e-6) and torch.allclose(lp, logp) and torch.allclose(v2, v)
    assert torch.allclose(lp, Normal(mean, std).log_prob(a).sum(-1), atol=1e-5)
    assert torch.allclose(ent, Normal(mean, std).entropy().sum(-1), atol=1e-5)
    assert torch.equal(env_a, ac.to_env(a)) and ac.stored_action() == ((2,), torch.float32)


# --- when the matrices are redrawn


@pytest.mark.parametrize("freq,redraws", [(-1, [0, 8, 16]), (0, [0, 8, 16]), (8, [0, 8, 16]), (10, [0, 8, 16]),
                                          (3, [0, 3, 6, 8, 11, 14, 16, 19, 22])])
def test_matrices_are_redrawn_at_each_rollout_start_and_every_sample_freq_steps_within(freq, redraws):
    h = head(L=2, A=1)
    e = SDEExploration(2, 1, num_envs=3, rollout=8, sample_freq=freq, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    seen, last = [], None
    for t in range(24):
        z = e.next(h, 3, g).clone()
        if last is None or not torch.equal(z, last):
            seen.append(t)
        last = z
    assert seen == redraws


def make(algo, num_envs=2, **overrides):
    spec = get_algo(algo)
    cfg = spec.cls.Config()
    for k, v in {**spec.overrides, "use_sde": True, **overrides}.items():
        setattr(cfg, k, v)
    a = spec.cls(cfg, BOX3, BOX2, num_envs, torch.device("cpu"), RNGStreams(0))
    a.total_steps = 1000
    return a


@pytest.mark.parametrize("algo,kw,period", [("sac", {"train_freq": 4, "learning_starts": 0}, 4),
                                            ("tqc", {"train_freq": 2, "sde_sample_freq": 1, "learning_starts": 0}, 1),
                                            ("sac", {"learning_starts": 100, "use_sde_at_warmup": True,
                                                     "train_freq": 3}, 3),
                                            ("ppo", {"n_steps": 6, "batch_size": 12, "sde_sample_freq": 3}, 3),
                                            ("a2c", {"n_steps": 5}, 5),
                                            ("trpo", {"n_steps": 6, "batch_size": 12, "sde_sample_freq": 3}, 3)])
def test_an_algorithm_acts_with_fixed_matrices_between_redraws(algo, kw, period):
    a = make(algo, hidden=(16,), **kw)
    obs = torch.randn(1, 3).expand(2, 3)  # both envs in one state
    with torch.no_grad():
        acts = [a.explore(obs)[0] for _ in range(2 * period)]
    # the noise is a function of the state while the matrices hold: the same state, the same action
    assert all(torch.equal(acts[0], x) for x in acts[1:period])
    assert not torch.equal(acts[period - 1], acts[period])
    assert all(torch.equal(acts[period], x) for x in acts[period + 1:])
    assert not torch.equal(acts[0][0], acts[0][1])  # each env its own matrix


def test_without_use_sde_at_warmup_the_warmup_acts_uniformly():
    a = make("sac", hidden=(16,), learning_starts=100, train_freq=8)
    obs = torch.randn(1, 3).expand(2, 3)
    with torch.no_grad():
        acts = torch.stack([a.explore(obs)[0] for _ in range(200)])
    assert len({tuple(x.flatten().tolist()) for x in acts}) == 200
    assert acts.amin() < -1.8 and acts.amax() > 1.8  # uniform over the Box [-2, 2]


# --- gradient isolation


def fill(algo, n):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(n):
            obs = torch.randn(algo.num_envs, 3, generator=g)
            _, extras = algo.explore(obs)
            nxt = torch.randn(algo.num_envs, 3, generator=g)
            flags = torch.zeros(algo.num_envs, dtype=torch.bool)
            algo.observe(Step(obs, extras, torch.randn(algo.num_envs, generator=g), flags, flags, nxt, nxt))


@pytest.mark.parametrize("algo_name", ["sac", "tqc"])
def test_each_loss_reaches_and_moves_only_its_own_network_and_the_actor_loss_reaches_sigma(algo_name):
    algo = make(algo_name, learning_starts=0, batch_size=16, hidden=(16,), lr=1e-2)
    fill(algo, 40)
    nets = {"actor": list(algo.actor.parameters()), "critics": list(algo.critics.parameters()),
            "log_alpha": [algo.log_alpha]}
    names = {id(getattr(algo, n)): n for n in algo.optimizers}
    phases, sigma_grads = [], []

    def step(optimizer, loss):
        for o in algo.declared_optimizers():
            o.zero_grad()
        loss.backward()
        before = {k: [p.detach().clone() for p in ps] for k, ps in nets.items()}
        graded = {k for k, ps in nets.items() if any(p.grad is not None and p.grad.abs().sum() > 0 for p in ps)}
        sigma_grads.append(algo.actor.sde.log_std.grad.abs().sum().item())
        optimizer.step()
        moved = {k for k, ps in nets.items() if any(not torch.equal(b, p) for b, p in zip(before[k], ps))}
        phases.append((names[id(optimizer)], graded, moved))

    batch = algo.replay.sample(16)
    drive(algo.phases(batch, algo.draw_noise(16)), step)
    assert phases == [("critic_opt", {"critics"}, {"critics"}), ("actor_opt", {"actor"}, {"actor"}),
                      ("alpha_opt", {"log_alpha"}, {"log_alpha"})]
    assert sigma_grads[0] == 0 and sigma_grads[1] > 0  # theta = sigma * z carries the actor loss to sigma


@pytest.mark.parametrize("algo_name", ["ppo", "a2c"])
def test_the_value_loss_reaches_only_the_value_parts_and_the_policy_loss_only_the_policy(algo_name):
    algo = make(algo_name, n_steps=4, hidden=(16,), ent_coef=0.01, **({"batch_size": 8} if algo_name == "ppo" else {}))
    fill(algo, 4)
    b = algo.prepare_batch()
    ac = algo.actor

    def grads(loss):
        algo.optimizer.zero_grad()
        loss.backward()
        body = [sum(p.grad[k].abs().sum().item() for p in (*ac.body.weights, *ac.body.biases)) for k in range(2)]
        policy = body[0] + sum(p.grad.abs().sum().item() for p in (*ac.action_net.parameters(), ac.head.log_std))
        value = body[1] + sum(p.grad.abs().sum().item() for p in ac.value_net.parameters())
        return policy, value

    policy, value = grads(torch.nn.functional.mse_loss(ac.evaluate_actions(b.obs, b.actions)[2], b.ret))
    assert policy == 0.0 and value > 0
    log_prob, entropy, _ = ac.evaluate_actions(b.obs, b.actions)
    policy, value = grads(-(b.adv * log_prob).mean() - 0.01 * entropy.mean())
    assert policy > 0 and value == 0.0
    assert ac.head.log_std.grad.abs().sum() > 0


# --- exact resume, the CLI


SAC_SDE = ["sac.use_sde=true", "sac.sde_sample_freq=-1", "sac.train_freq=3", "sac.gradient_steps=2",
           "sac.learning_starts=100", "sac.batch_size=32", "sac.hidden=[32, 32]", "eval.episodes=0",
           "progress=false", "tensorboard=false"]
PPO_SDE = ["ppo.use_sde=true", "ppo.sde_sample_freq=4", "ppo.n_steps=32", "ppo.batch_size=32", "ppo.n_epochs=2",
           "env.num_envs=2", "ppo.hidden=[16, 16]", "eval.episodes=0", "progress=false", "tensorboard=false"]


@pytest.mark.parametrize("algo,sets,n", [("sac", SAC_SDE, 301), ("ppo", PPO_SDE, 256)])
def test_trained_2n_equals_n_then_resumed_bit_for_bit_with_gsde(tmp_path, algo, sets, n):
    # sac: the checkpoint falls inside a rollout of train_freq=3 (301 = 3 * 100 + 1), so the resumed
    # run acts on with the matrices it saved
    a = Learner(build_config(algo, "Pendulum-v1", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", algo, "Pendulum-v1", "--steps", str(n), "--seed", "3", "--run-dir", str(tmp_path / "b"),
                 *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for name in a.algo.networks:
        if isinstance(getattr(a.algo, name), torch.nn.Module):
            pa = torch.cat([p.flatten().float() for p in getattr(a.algo, name).state_dict().values()])
            pb = torch.cat([p.flatten().float() for p in getattr(b.algo, name).state_dict().values()])
            assert torch.equal(pa, pb), name
    sde_log_std = a.algo.actor.sde.log_std if algo == "sac" else a.algo.actor.head.log_std
    assert not torch.equal(sde_log_std, torch.full_like(sde_log_std, -3.0 if algo == "sac" else 0.0))


def test_cli_trains_sac_and_tqc_with_gsde_and_refuses_it_where_it_cannot_apply(tmp_path, capsys):
    for algo in ("sac", "tqc"):
        sets = [f"{algo}.use_sde=true", f"{algo}.sde_sample_freq=4", f"{algo}.learning_starts=64",
                f"{algo}.batch_size=32", f"{algo}.hidden=[32]", f"{algo}.use_expln=true"]
        assert main(["train", algo, "Pendulum-v1", "--steps", "300", "--run-dir", str(tmp_path / algo), *QUIET,
                     *sum((["--set", s] for s in sets), [])]) == 0
        agent = corral.load(tmp_path / algo / "checkpoints" / "latest.pt")
        assert isinstance(agent.algo.actor, SDESquashedGaussianActor) and agent.algo.cfg.use_expln
    capsys.readouterr()
    assert main(["train", "ppo", "CartPole-v1", "--steps", "64", "--set", "ppo.use_sde=true", *QUIET,
                 "--run-dir", str(tmp_path / "c")]) == 2
    assert "continuous actions" in capsys.readouterr().err
    assert main(["train", "ppo_lstm", "Pendulum-v1", "--steps", "64", "--set", "ppo_lstm.use_sde=true", *QUIET,
                 "--run-dir", str(tmp_path / "d")]) == 2
    assert "use_sde" in capsys.readouterr().err


# --- rl-zoo


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
@pytest.mark.parametrize("algo,env", [("tqc", "BipedalWalker-v3"), ("sac", "MountainCarContinuous-v0"),
                                      ("ppo", "Pendulum-v1"), ("a2c", "Pendulum-v1")])
def test_rl_zoo_gsde_entries_translate_with_nothing_refused(algo, env):
    from corral import zoo as Z

    data = __import__("yaml").safe_load(Z.bundled_file(algo).read_text())
    t = Z.translate(algo, data, env, is_atari=False)
    assert t.refused == {} and (f"{algo}.use_sde", True) in t.pairs
    cfg = build_config(algo, env, zoo=True)
    assert cfg.algo_cfg.use_sde
    if algo == "tqc":  # dict(log_std_init=-3, net_arch=[400, 300], use_expln=True)
        assert cfg.algo_cfg.log_std_init == -3 and cfg.algo_cfg.use_expln and tuple(cfg.algo_cfg.hidden) == (400, 300)


# --- learning


def test_sac_with_gsde_learns_pendulum():
    agent = corral.train("sac", "Pendulum-v1", steps=LEARN_STEPS, seed=0, save_run=False, **LEARN)
    held_out = corral.evaluate(agent, "Pendulum-v1", episodes=10, seed=1234)
    assert held_out["mean_return"] > -400, held_out


# seed 0: 5-episode evaluations -1148 at 3k, -516 at 4k, -126 at 5k, -125 at 6k; this test's held-out
# 10 episodes -187.9 (min -409, max -4), 37 s of CPU on one core
LEARN_STEPS = 6000
LEARN = {"sac.use_sde": True, "sac.lr": 1e-3, "sac.hidden": [64, 64], "sac.learning_starts": 500,
         "sac.batch_size": 128, "eval.episodes": 0, "tensorboard": False}
