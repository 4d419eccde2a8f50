"""MAPPO and IPPO: the agent dimension folded into PPO's batch, absent agents masked out of
every loss, value normalization, checkpoints, the CLI, and learning on a small game."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from envs_for_tests import trained_and_resumed  # noqa: E402

from corral.actors.multiagent import ValueNorm  # noqa: E402
from corral.algos.base import Step  # noqa: E402
from corral.cli import main  # noqa: E402
from corral.errors import UserError  # noqa: E402
from corral.returns import gae  # noqa: E402
from corral.train.learner import Learner  # noqa: E402
from corral.train.setup import build_config  # noqa: E402

LEAVING = "tests/ma_envs.py:LeavingEnv"
QUIET = ["eval.episodes=0", "progress=false", "tensorboard=false"]


def learner(algo="mappo", env=LEAVING, steps=120, sets=(), seed=0):
    sets = [*QUIET, "env.num_envs=2", f"{algo}.n_steps=6", f"{algo}.hidden=[16, 16]", *sets]
    return Learner(build_config(algo, env, steps=steps, seed=seed, sets=sets), None)


def collect(lr: Learner, steps: int):
    """Fill the rollout (no update): the Learner's loop, one step at a time."""
    algo, env = lr.algo, lr.env
    obs = lr.obs
    with torch.no_grad():
        for _ in range(steps):
            act, ex = algo.explore(obs)
            nxt, rew, te, tr, info = env.step(act)
            algo.observe(Step(obs, ex, rew, te, tr, info["final_obs"], nxt, agents=info["agents"]))
            obs = nxt
    lr.obs = obs


def test_rows_hold_each_agents_observation_id_state_and_action_mask():
    lr = learner()
    actor, L = lr.algo.actor, lr.algo.layout
    x, present = actor.columns(lr.obs)
    view = L.split(lr.obs)
    assert x.shape == (2 * 3, actor.row_dim()) and present.all()
    for n in range(2):
        for a in range(3):
            row = x[n * 3 + a]
            assert torch.equal(row[:3], view.obs[n, a]) and row[3:6].tolist() == torch.eye(3)[a].tolist()
            assert torch.equal(row[6:15], view.state[n])  # MAPPO: the global state in the value's input
            assert row[18:].tolist() == view.action_mask[n, a].float().tolist()
    ippo = learner("ippo").algo.actor
    xi, _ = ippo.columns(lr.obs)
    assert torch.equal(xi[4, 6:9], view.obs[1, 1])  # IPPO: the agent's own observation


def test_gae_runs_per_agent_and_absent_steps_are_left_out_of_the_batch():
    lr = learner()
    collect(lr, 6)  # one episode: agent_1 leaves after 3 steps
    algo = lr.algo
    data = algo.storage.data
    assert algo.present[:, 1::3].sum(0).tolist() == [3, 3] and algo.present[:, 0::3].all()
    # the leaver's column is terminated at its last step and on every absent one
    assert data.terminated[:, 1].tolist() == [False, False, True, True, True, True]
    batch = algo.prepare_batch()
    assert batch.size == int(algo.present.sum()) == 2 * 6 * 2 + 2 * 3
    # per-column GAE against a plain loop, column 1 (the leaver), with its own returns
    norm = algo.actor.value_norm
    nxt_values = torch.cat([data.values[1:], torch.zeros_like(data.values[:1])])
    adv, ret = gae(data.rewards, data.values, nxt_values, data.terminated, data.truncated, 0.99, 0.95)
    rows = algo.present.reshape(-1).nonzero().squeeze(1)
    leaver = [i for i, r in enumerate(rows.tolist()) if r % 6 == 1]
    r = data.rewards[:3, 1].tolist()
    v = data.values[:3, 1].tolist()
    a_ref, nxt = [0.0] * 3, 0.0
    for t in reversed(range(3)):
        delta = r[t] + (0.99 * v[t + 1] if t < 2 else 0.0) - v[t]
        nxt = delta + (0.99 * 0.95 * nxt if t < 2 else 0.0)
        a_ref[t] = nxt
    assert torch.allclose(adv[:3, 1], torch.tensor(a_ref), atol=1e-5)
    assert torch.allclose(norm.denormalize(batch.ret[leaver]), ret[:3, 1], atol=1e-4)


def test_absent_agent_steps_add_nothing_to_any_loss():
    """Two learners with the same rollout, except garbage in every absent (env, agent) step:
    after the update their networks and value normalizers are equal."""
    a, b = learner(), learner()  # the same seed: the same rollout (a deepcopy would split FlatAdam's views)
    collect(a, 6)
    collect(b, 6)
    absent = ~b.algo.present
    assert absent.any()
    d = b.algo.storage.data
    d.obs[absent] = 123.0
    d.actions[absent] = 1
    d.log_probs[absent] = -7.0
    d.values[absent] = 55.0
    d.rewards[absent] = -99.0
    d.final_obs[absent] = 9.0
    sa, sb = a.algo.update(0.5), b.algo.update(0.5)
    for (k, pa), pb in zip(a.algo.actor.state_dict().items(), b.algo.actor.state_dict().values()):
        assert torch.equal(pa, pb), k
    assert sa == sb


def test_policy_loss_moves_only_the_policy_and_value_loss_only_the_value():
    lr = learner()
    collect(lr, 6)
    algo = lr.algo
    batch = algo.prepare_batch()
    actor = algo.actor
    log_prob, entropy, value = actor.evaluate_actions(batch.obs, batch.actions)
    pg = -(batch.adv * (log_prob - batch.log_probs).exp()).mean() - 0.01 * entropy.mean()
    v = (value - batch.ret).square().mean()
    for loss, moved, still in ((pg, actor.pi, actor.v), (v, actor.v, actor.pi)):
        actor.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in moved.parameters())
        assert all(p.grad is None or not p.grad.any() for p in still.parameters())


def test_value_norm_matches_debiased_running_moments():
    vn = ValueNorm(beta=0.9)
    xs = [torch.tensor([1.0, 3.0]), torch.tensor([10.0, 14.0])]
    for x in xs:
        vn.update(x)
    # hand-worked: m = 0.9 * (0.1 * 2) + 0.1 * 12 = 1.38, m2 = 0.9 * (0.1 * 5) + 0.1 * 148 = 15.25,
    # debias d = 0.9 * 0.1 + 0.1 = 0.19: mean 7.263..., var 15.25 / 0.19 - mean^2
    mean = 1.38 / 0.19
    var = 15.25 / 0.19 - mean ** 2
    m, s = vn.stats()
    assert m.item() == pytest.approx(mean) and s.item() == pytest.approx(var)
    y = torch.tensor([0.5, -2.0])
    assert torch.allclose(vn.normalize(y), (y - mean) / var ** 0.5, atol=1e-5)
    assert torch.allclose(vn.denormalize(vn.normalize(y)), y, atol=1e-5)
    assert torch.equal(ValueNorm(enabled=False).normalize(y), y)


def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path):
    sets = [*QUIET, "env.num_envs=2", "mappo.n_steps=6", "mappo.hidden=[16, 16]"]
    a, b = trained_and_resumed("mappo", LEAVING, sets, n=60, seed=3, run_dir=tmp_path / "b")
    for (k, pa), pb in zip(a.algo.actor.state_dict().items(), b.algo.actor.state_dict().values()):
        assert torch.equal(pa, pb), k
    assert a.algo.updates == 10


def test_cli_trains_mappo_on_mpe_and_evaluates_team_and_agent_returns(tmp_path, capsys):
    pytest.importorskip("mpe2")
    assert main(["train", "mappo", "mpe:simple_spread_v3", "--steps", "400", "--run-dir", str(tmp_path / "r"),
                 "--json", "--set", "env.num_envs=2", "--set", "mappo.n_steps=50", "--set", "eval.episodes=2",
                 "--set", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 400 and len(summary["eval"]["agent_returns"]) == 3
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("agent_steps") == 300 for r in rows)


def test_single_and_multi_agent_mismatches_are_user_errors():
    with pytest.raises(UserError, match="single-agent"):
        Learner(build_config("ppo", "mpe:simple_spread_v3", sets=QUIET), None)
    with pytest.raises(UserError, match="not a PettingZoo env"):
        Learner(build_config("mappo", "CartPole-v1", sets=QUIET), None)
    with pytest.raises(UserError, match="gradient workers"):
        learner(sets=["scheme.grad_workers=2"])
    with pytest.raises(UserError, match="Ray collectors are built for the on-policy"):
        Learner(build_config("qmix", LEAVING, sets=[*QUIET, "scheme.collectors=2"]), None)
    assert main(["train", "ippo", "CartPole-v1", "--steps", "10"]) == 2


def test_agent_acts_on_a_dict_of_agent_observations():
    from ma_envs import LeavingEnv

    from corral.agent import Agent

    lr = learner()
    agent = Agent(lr.algo, lr.cfg)
    env = LeavingEnv()
    obs, infos = env.reset(seed=lr.rng.env_seed())  # what env 0 of the learner's vector env saw
    obs = {a: ({"observation": o, "action_mask": infos[a]["action_mask"]} if "action_mask" in infos[a] else o)
           for a, o in obs.items()}
    acts = agent.act(obs)
    packed = lr.algo.act(lr.obs)[0].tolist()  # the same policy on the vector env's packed rows
    assert acts == dict(zip(lr.algo.layout.agents, packed)) and acts["agent_0"] != 2
    del obs["agent_1"]  # an absent agent gets no action
    assert set(agent.act(obs)) == {"agent_0", "agent_2"}
    with pytest.raises(UserError, match="expected 3"):
        agent.act({"agent_0": np.zeros(5, np.float32)})


@pytest.mark.parametrize("algo,shared", [("mappo", True), ("ippo", True), ("ippo", False)])
def test_learns_the_leaving_game(algo, shared):
    """Each agent is paid for matching the parity it observes; a random policy's team return
    is about 2.8 of 6 (uniform over the valid actions). A held-out deterministic evaluation (other seeds)
    reaches 5.5, with one network for all agents or one per agent."""
    cfg = build_config(algo, LEAVING, steps=6000, seed=1, sets=[
        "progress=false", "tensorboard=false", "env.num_envs=4", f"{algo}.n_steps=24", f"{algo}.hidden=[32, 32]",
        f"{algo}.lr=0.003", "eval.episodes=20", f"{algo}.share_params={str(shared).lower()}"])
    summary = Learner(cfg, None).train()
    assert summary["eval_return"] >= 5.5, summary["eval"]


def test_box_actions_are_scaled_to_the_agents_bounds():
    pytest.importorskip("mpe2")
    lr = learner(env="mpe:simple_spread_v3", steps=100, sets=["env.kwargs={continuous_actions: true}",
                                                                "mappo.n_steps=25", "mappo.log_std_init=1.0"])
    assert not lr.algo.layout.discrete and lr.algo.actor.stored_action() == ((5,), torch.float32)
    lr.train()
    assert lr.algo.updates == 2
    env_action, extras = lr.algo.explore(lr.obs)
    assert env_action.shape == (2, 3, 5) and extras.action.shape == (6, 5)
    assert (env_action >= 0).all() and (env_action <= 1).all()  # MPE's Box(0, 1): unit Gaussian samples scaled
    assert (extras.action.abs() > 1).any()  # (wide samples, clipped into the bounds)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_beats_a_random_team_on_simple_spread(algo):
    """MPE simple_spread (3 agents), the preset at 100k env steps, seed 0: the deterministic
    team return over 20 episodes beats a uniformly random team's -27.05 +- 0.61 (200 episodes,
    docs/ledger.md) by at least 3."""
    pytest.importorskip("mpe2")
    cfg = build_config(algo, "mpe:simple_spread_v3", steps=100_000, seed=0, sets=["progress=false",
                                                                                "tensorboard=false"])
    summary = Learner(cfg, None).train()
    assert summary["eval_return"] >= -24.0, summary["eval"]


# --- per-agent parameters (share_params=false): one batched network over agents

def test_agent_mlp_sends_each_row_through_its_own_agents_weights_in_any_order():
    from corral.actors.multiagent import AgentMLP

    torch.manual_seed(0)
    net = AgentMLP(3, 4, (8,), "tanh", 2)
    x = torch.randn(11, 4)
    agent = torch.tensor([2, 0, 0, 1, 2, 2, 1, 0, 2, 2, 1])
    w1, w2 = net.net.weights
    b1, b2 = net.net.biases
    ref = torch.stack([torch.tanh(x[r] @ w1[a].T + b1[a, 0]) @ w2[a].T + b2[a, 0]
                       for r, a in enumerate(agent.tolist())])
    assert torch.allclose(net(x, agent), ref, atol=1e-6)
    stacked = x[:9].reshape(3, 3, 4)  # 3 envs x 3 agents, env-major: the acting path
    assert torch.allclose(net.stacked(stacked).reshape(9, 2), net(x[:9], torch.arange(3).repeat(3)), atol=1e-6)


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_per_agent_parameters_agent_is_loss_moves_only_agent_is_weights(algo):
    lr = learner(algo, sets=[f"{algo}.share_params=false"])
    collect(lr, 6)
    algo_, actor = lr.algo, lr.algo.actor
    assert not actor.agent_id and actor.pi_dim == algo_.layout.obs_dim  # no agent id in the inputs
    batch = algo_.prepare_batch()
    agent = batch.obs[:, -1].long()  # rows end with their agent's index
    assert sorted(agent.unique().tolist()) == [0, 1, 2]
    for i in range(3):
        rows = agent == i
        actor.zero_grad()
        log_prob, entropy, value = actor.evaluate_actions(batch.obs[rows], batch.actions[rows])
        loss = -(batch.adv[rows] * log_prob).mean() - 0.01 * entropy.mean() + (value - batch.ret[rows]).square().mean()
        loss.backward()
        for net in (actor.pi.net, actor.v.net):
            for p in [*net.weights, *net.biases]:
                touched = p.grad.flatten(1).abs().sum(1) > 0
                assert touched.tolist() == [a == i for a in range(3)], (algo, i)
    # an update moves every agent's slice, each its own way (a fresh learner: zero_grad above
    # detached the flat optimizer's gradient views)
    lr = learner(algo, sets=[f"{algo}.share_params=false"])
    collect(lr, 6)
    before = [p.detach().clone() for p in lr.algo.actor.pi.net.weights]
    lr.algo.update(0.5)
    for b, p in zip(before, lr.algo.actor.pi.net.weights):
        moved = (p - b).flatten(1).norm(dim=1)
        assert (moved > 0).all() and not torch.allclose(moved[0], moved[1])


def test_per_agent_parameters_resume_bit_for_bit(tmp_path):
    sets = [*QUIET, "env.num_envs=2", "ippo.n_steps=6", "ippo.hidden=[16, 16]", "ippo.share_params=false"]
    a, b = trained_and_resumed("ippo", LEAVING, sets, n=36, seed=4, run_dir=tmp_path / "b")
    for (k, pa), pb in zip(a.algo.actor.state_dict().items(), b.algo.actor.state_dict().values()):
        assert torch.equal(pa, pb), k
    assert a.algo.updates == 6 and a.algo.actor.pi.net.weights[0].shape[0] == 3


def test_per_agent_parameters_box_actions_have_a_log_std_per_agent():
    pytest.importorskip("mpe2")
    lr = learner(env="mpe:simple_spread_v3", steps=50, sets=["env.kwargs={continuous_actions: true}",
                                                               "mappo.n_steps=25", "mappo.share_params=false"])
    actor = lr.algo.actor
    assert actor.head.log_std.shape == (3, 5)
    with torch.no_grad():
        actor.head.log_std[1] = -20.0  # agent 1 acts at its mean, the others wide
    env_action, extras = lr.algo.explore(lr.obs)
    x = extras.x
    mean = actor._policy(x)
    dev = (extras.action - mean).abs().reshape(2, 3, 5)
    assert (dev[:, 1] < 1e-6).all() and (dev[:, 0] > 1e-3).any()
    lr.train()
    assert lr.algo.updates == 1


def test_mpe_run_resumed_mid_episode_equals_one_that_never_stopped(tmp_path):
    """MPE envs carry their state into checkpoints (``corral.envs.mpe``): the checkpoint at 50
    vector steps is 10 steps into the second 40-step episode, and the resumed run continues it."""
    pytest.importorskip("mpe2")
    sets = [*QUIET, "env.num_envs=2", "mappo.n_steps=25", "mappo.hidden=[16, 16]", "env.kwargs={max_cycles: 40}"]
    a, b = trained_and_resumed("mappo", "mpe:simple_spread_v3", sets, n=100, seed=5, run_dir=tmp_path / "b")
    for (k, pa), pb in zip(a.algo.actor.state_dict().items(), b.algo.actor.state_dict().values()):
        assert torch.equal(pa, pb), k
    assert a.algo.updates == 4 and a.env.copyable
