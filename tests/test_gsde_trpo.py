"""TRPO with gSDE (corral/algos/trpo.py with corral/nets/sde.py, actors/sde.py, algos/sde.py): the
KL of the state-dependent distribution against torch.distributions, the trust region held after
every update, gradient isolation of the policy step and the value fitting, exact resume, and
rl-zoo's trpo entries translating with nothing refused."""

import importlib.util

import pytest
import torch
from torch.distributions import Normal
from torch.distributions import kl_divergence as torch_kl

import corral
from corral.actors.sde import SDEActorCritic
from corral.algos.base import Step
from corral.algos.trpo import kl_divergence
from corral.cli import main
from corral.train.learner import Learner
from corral.train.setup import build_config

HAVE_ZOO = importlib.util.find_spec("rl_zoo3") is not None
QUIET = ["eval.episodes=0", "progress=false", "tensorboard=false"]
SDE = ["trpo.use_sde=true", "trpo.sde_sample_freq=4", "env.num_envs=2", "trpo.hidden=[32, 32]"]


def learner(steps=10**6, seed=1, sets=()):
    return Learner(build_config("trpo", "Pendulum-v1", steps=steps, seed=seed,
                                sets=["trpo.n_steps=128", "trpo.batch_size=64", *SDE, *sets, *QUIET]), None)


def collect(L):
    """Step the Learner's env until its algorithm is ready to update."""
    algo, obs = L.algo, L.obs
    with torch.no_grad():
        while not algo.ready():
            a, ex = algo.explore(obs)
            nxt, r, te, tr, info = L.env.step(a)
            algo.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    L.obs = obs


def test_the_policy_step_reads_the_state_dependent_distribution_and_its_kl():
    L = learner()
    algo = L.algo
    assert isinstance(algo.actor, SDEActorCritic) and algo.sde is not None
    collect(L)
    obs = algo.storage.data.obs.flatten(0, 1)
    ac = algo.actor
    with torch.no_grad():
        out = algo.policy_outputs(obs)
        phi = ac.body(obs)[0]
        std = (phi.square() @ ac.head.std().square() + 1e-6).sqrt()
        mean = ac.action_net(phi)
    assert torch.allclose(out, torch.cat([mean, std.log()], -1), atol=1e-6)
    assert std.std() > 0  # a per-state std, not one for every state
    # the KL the trust region measures is the Gaussian KL with each state's std
    other = torch.cat([mean + 0.1 * torch.randn_like(mean), std.log() + 0.2 * torch.randn_like(std)], -1)
    other_mean, other_log_std = other.chunk(2, -1)
    expected = torch_kl(Normal(mean, std), Normal(other_mean, other_log_std.exp())).sum(-1)
    assert torch.allclose(kl_divergence(ac.head, out, other), expected, atol=1e-5)


@pytest.mark.parametrize("sets", [["trpo.target_kl=0.01"], ["trpo.target_kl=0.002", "trpo.use_expln=true",
                                                           "trpo.full_std=false"]])
def test_the_kl_after_every_update_is_within_target_kl_with_gsde(sets):
    L = learner(sets=sets)
    algo = L.algo
    target = algo.cfg.target_kl
    accepted, sigmas = 0, [algo.actor.head.log_std.detach().clone()]
    for _ in range(6):
        collect(L)
        obs = algo.storage.data.obs.flatten(0, 1).clone()
        with torch.no_grad():
            old = algo.policy_outputs(obs)
        stats = algo.update(0.0)
        with torch.no_grad():
            kl = kl_divergence(algo.actor.head, old, algo.policy_outputs(obs)).mean().item()
        assert kl < target, (kl, stats)
        assert kl == pytest.approx(stats["kl"], rel=1e-4, abs=1e-7)
        accepted += stats["line_search_success"] == 1.0
        sigmas.append(algo.actor.head.log_std.detach().clone())
    assert accepted >= 4
    assert not torch.equal(sigmas[0], sigmas[-1])  # the natural-gradient step moves sigma too


def test_the_policy_step_moves_only_the_policy_parts_and_the_value_fitting_only_the_value_parts():
    L = learner(sets=["trpo.n_steps=64", "trpo.batch_size=32"])
    collect(L)
    algo, ac = L.algo, L.algo.actor
    body = ac.body

    def snap():
        rows = [t.detach().clone() for t in (*body.weights, *body.biases)]
        return {"policy_body": [r[0] for r in rows], "value_body": [r[1] for r in rows],
                "action_net": [p.detach().clone() for p in ac.action_net.parameters()],
                "log_std": [ac.head.log_std.detach().clone()],
                "value_net": [p.detach().clone() for p in ac.value_net.parameters()]}

    def moved(a, b):
        return {k for k in a if any(not torch.equal(x, y) for x, y in zip(a[k], b[k]))}

    batch = algo.prepare_batch()
    s0 = snap()
    stats = algo.policy_step(batch)
    assert stats["line_search_success"] == 1.0
    s1 = snap()
    assert moved(s0, s1) == {"policy_body", "action_net", "log_std"}
    algo.value_step(batch.obs, batch.ret)
    assert moved(s1, snap()) == {"value_body", "value_net"}


def test_trained_2n_equals_n_then_resumed_bit_for_bit_with_gsde(tmp_path):
    sets = ["trpo.n_steps=64", "trpo.batch_size=32", "trpo.normalize_obs=true", *SDE, *QUIET]
    n = 1000  # not a rollout boundary: the checkpoint waits for one
    a = Learner(build_config("trpo", "Pendulum-v1", steps=2 * n, seed=3, sets=sets), None)
    a.train()
    assert main(["train", "trpo", "Pendulum-v1", "--steps", str(n), "--seed", "3", "--run-dir",
                 str(tmp_path / "b"), *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    pa = torch.cat([p.flatten().double() for p in a.algo.actor.state_dict().values()])
    pb = torch.cat([p.flatten().double() for p in b.algo.actor.state_dict().values()])
    assert torch.equal(pa, pb)
    assert torch.equal(a.algo.sde.z, b.algo.sde.z) and a.algo.sde.step == b.algo.sde.step
    assert not torch.equal(a.algo.actor.head.log_std, torch.zeros_like(a.algo.actor.head.log_std))


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
@pytest.mark.parametrize("env", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_rl_zoo_trpo_gsde_entries_translate_with_nothing_refused(env):
    from corral import zoo as Z

    data = __import__("yaml").safe_load(Z.bundled_file("trpo").read_text())
    t = Z.translate("trpo", data, env, is_atari=False)
    assert t.refused == {} and ("trpo.use_sde", True) in t.pairs and ("trpo.sde_sample_freq", 4) in t.pairs
    cfg = build_config("trpo", env, zoo=True)
    assert cfg.algo_cfg.use_sde and cfg.algo_cfg.sde_sample_freq == 4 and cfg.env.num_envs == 2
