"""MADDPG and MATD3: the centralised critic's target (hand-worked, with an absent agent and a
done), MATD3's min and smoothing, the straight-through Gumbel-softmax, absent agents masked
out of every loss, gradient isolation, exact resume, the CLI, acting on dicts, and learning
on two small games."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("pettingzoo")

from envs_for_tests import trained_and_resumed  # noqa: E402

from corral.algos.maddpg import gumbel_softmax  # noqa: E402
from corral.algos.offpolicy import drive  # noqa: E402
from corral.cli import main  # noqa: E402
from corral.storage.replay import ReplayBatch  # noqa: E402
from corral.train.learner import Learner  # noqa: E402
from corral.train.setup import build_config  # noqa: E402

LEAVING = "tests/ma_envs.py:LeavingEnv"
TARGETS = "tests/ma_envs.py:TargetsEnv"
QUIET = ["progress=false", "tensorboard=false"]


def learner(algo="maddpg", env=LEAVING, steps=1, seed=0, sets=()):
    return Learner(build_config(algo, env, steps=steps, seed=seed, sets=[
        *QUIET, "eval.episodes=0", "env.num_envs=2", f"{algo}.learning_starts=40", f"{algo}.batch_size=16",
        f"{algo}.hidden=[16]", *sets]), None)


def packed(L, obs, state, present, action_mask=None):
    """Packed rows from per-agent parts (lists over the batch)."""
    B = len(obs)
    x = torch.zeros(B, L.size)
    x[:, :L.state_start] = torch.tensor(obs, dtype=torch.float32).reshape(B, -1)
    x[:, L.state_start:L.mask_start] = torch.tensor(state, dtype=torch.float32)
    x[:, L.mask_start:L.action_mask_start] = torch.tensor(present, dtype=torch.float32)
    if action_mask is not None:
        x[:, L.action_mask_start:] = torch.tensor(action_mask, dtype=torch.float32).reshape(B, -1)
    return x


def batch_of(obs, action, reward, next_obs, discount):
    B = obs.shape[0]
    return ReplayBatch(obs, action, torch.tensor(reward), next_obs, torch.tensor(discount), torch.ones(B),
                       torch.arange(B), torch.tensor(discount) == 0)


class LinearCritics(nn.Module):
    """Known critics: ``Q_1 = sum(x) + a.w``, and for two, ``Q_2 = 2 a.w - 10`` (``w = 1, 2, ...``)."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x, a):
        aw = (a * torch.arange(1, a.shape[-1] + 1, dtype=a.dtype)).sum(-1)
        q = [x.sum(-1) + aw, 2 * aw - 10][:self.n]
        return torch.stack(q)


def test_maddpg_critic_target_by_hand_with_an_absent_agent_and_a_done():
    algo = learner().algo
    L = algo.layout  # 3 agents, 3 actions (agent_2's third padded), state = the 9 observation values
    assert (L.n_agents, L.n_actions, L.state_dim) == (3, 3, 9)
    algo.critics_target = LinearCritics(1)
    target_pre = torch.tensor([[0.0, 1.0, 5.0], [3.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    algo.actor_target.pre = lambda obs: target_pre.expand(obs.shape[0], 3, 3)
    masks = [[1, 1, 0], [1, 1, 1], [1, 1, 0]]  # agent_0's action 2 masked; agent_2's padded
    state = [[0.5] * 3, [0.0] * 9, [1.0] * 9]
    nxt = packed(L, torch.zeros(3, 3, 3).tolist(), [s + [0.0] * (9 - len(s)) for s in state],
                 [[1, 1, 1], [1, 0, 1], [1, 1, 1]], [masks, [masks[0], [0, 0, 0], masks[2]], masks])
    batch = batch_of(nxt, torch.zeros(3, 3, dtype=torch.long), [1.0, -0.5, 2.0], nxt, [0.95, 0.95, 0.0])
    # greedy valid target actions: agent_0 -> 1 (5 is masked), agent_1 -> 0, agent_2 -> 1 (9 is padding)
    # joint one-hot [0 1 0 | 1 0 0 | 0 1 0] . w(1..9) = 2 + 4 + 8 = 14
    # row 0: 1 + 0.95 * (1.5 + 14); row 1: agent_1 absent, its action zeroed: -0.5 + 0.95 * (0 + 2 + 8);
    # row 2: done, the reward alone
    expected = torch.tensor([1 + 0.95 * 15.5, -0.5 + 0.95 * 10.0, 2.0])
    assert torch.allclose(algo.td_target(batch, {}), expected)


def test_matd3_target_takes_the_min_of_twin_critics_on_smoothed_clipped_actions():
    algo = learner("matd3", TARGETS).algo
    L = algo.layout  # 2 agents, Box(-1, 1, (1,)), state = the 4 observation values
    cfg = algo.cfg
    assert (cfg.n_critics, cfg.policy_delay, cfg.target_noise, cfg.target_noise_clip) == (2, 2, 0.2, 0.5)
    algo.critics_target = LinearCritics(2)
    algo.actor_target.pre = lambda obs: torch.tensor([[math.atanh(0.5)], [math.atanh(-0.9)]]).expand(
        obs.shape[0], 2, 1)
    nxt = packed(L, [[[0.25, 0.25], [0.25, 0.25]], [[2.0, 2.0], [2.0, 2.0]]], [[0.25] * 4, [2.0] * 4],
                 [[1, 1], [1, 1]])
    batch = batch_of(nxt, torch.zeros(2, 2, 1), [0.5, 0.5], nxt, [0.9, 0.9])
    noise = {"target": torch.tensor([[[1.0], [-4.0]], [[1.0], [-4.0]]])}
    # smoothing: 0.2 * (1, -4) = (0.2, -0.8), clipped to (0.2, -0.5): actions (0.7, -1.4) -> (0.7, -1.0)
    # a.w = 0.7 - 2.0 = -1.3; row 0: Q1 = 1 - 1.3 = -0.3, Q2 = -12.6; row 1: Q1 = 8 - 1.3, Q2 = -12.6
    # (twin min: Q2 in both rows); without noise a = (0.5, -0.9): a.w = -1.3 as well, so check that too
    assert torch.allclose(algo.td_target(batch, noise), torch.tensor([0.5 + 0.9 * -12.6] * 2))
    algo.critics_target = LinearCritics(1)
    assert torch.allclose(algo.td_target(batch, noise), torch.tensor([0.5 + 0.9 * -0.3, 0.5 + 0.9 * 6.7]))
    noise = {"target": torch.tensor([[[-4.0], [4.0]]] * 2)}  # (-0.5, 0.5): (0.0, -0.4), a.w = -0.8
    assert torch.allclose(algo.td_target(batch, noise), torch.tensor([0.5 + 0.9 * 0.2, 0.5 + 0.9 * 7.2]))


def test_straight_through_gumbel_softmax_is_one_hot_forward_and_the_soft_gradient_backward():
    torch.manual_seed(0)
    logits = torch.randn(6, 4, requires_grad=True)
    g = -torch.empty(6, 4).exponential_().log()
    c = torch.randn(6, 4)
    y = gumbel_softmax(logits, g, 0.5)
    assert torch.equal(y, torch.nn.functional.one_hot((logits + g).argmax(-1), 4).float())
    (y * c).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    (((logits + g) / 0.5).softmax(-1) * c).sum().backward()
    assert torch.allclose(grad, logits.grad) and grad.abs().sum() > 0


@pytest.mark.parametrize("algo,env,sets", [("maddpg", LEAVING, ()), ("matd3", TARGETS, ["matd3.shared_actor=false"])])
def test_critic_loss_moves_only_the_critic_and_actor_loss_only_the_actor(algo, env, sets):
    lr = learner(algo, env, steps=60, sets=sets)
    lr.train()
    a = lr.algo
    a.grad_steps = 1  # matd3: the next step is an actor step
    batch = a.replay.sample(16)
    gen = a.phases(batch, a.draw_noise(16))
    groups = {n: list(getattr(a, n).parameters()) for n in a.networks}
    for which in ("critics", "actor"):
        for ps in groups.values():
            for p in ps:
                p.grad = None
        _, loss = next(gen) if which == "critics" else gen.send(None)
        loss.backward()
        for name, ps in groups.items():
            has = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in ps]
            assert all(has) if name == which else not any(has), (which, name)


def test_matd3_updates_the_actor_and_targets_every_second_step():
    a = learner("matd3", TARGETS, steps=60)
    a.train()
    algo = a.algo
    algo.grad_steps = 0
    moved = []
    for _ in range(4):
        before = [p.clone() for n in ("actor", "actor_target", "critics", "critics_target")
                  for p in getattr(algo, n).parameters()]
        algo.train_step(algo.replay.sample(16))
        algo.grad_steps += 1
        after = [p for n in ("actor", "actor_target", "critics", "critics_target") for p in getattr(algo, n).parameters()]
        moved.append(not all(torch.equal(x, y) for x, y in zip(before[:len(before) // 2], after[:len(after) // 2])))
    assert moved == [False, True, False, True]


@pytest.mark.parametrize("critic_input", ["state", "observations"])
def test_absent_agents_add_nothing_to_either_loss(critic_input):
    lr = learner(steps=100, sets=[f"maddpg.critic_input={critic_input}"])
    lr.train()
    algo = lr.algo
    L = algo.layout
    batch = algo.replay.sample(64)
    absent = ~L.split(batch.obs).agent_mask
    assert absent.any() and (~absent).any()
    noise = algo.draw_noise(64)

    def losses(b):
        out = []
        drive(algo.phases(b, noise), lambda opt, loss: out.append(loss.detach()))
        return out

    garbage = batch.obs.clone()
    garbage[:, :L.state_start].view(-1, L.n_agents, L.obs_dim)[absent] = 77.0  # obs slots, not the state
    action = batch.action.clone()
    action[absent] = 1  # a different replayed action for every absent agent
    assert (action != batch.action).any()
    changed = ReplayBatch(**{**batch.__dict__, "obs": garbage, "action": action})
    base = losses(batch)
    assert len(base) == 2 and all(torch.equal(x, y) for x, y in zip(base, losses(changed)))
    # the same change for a present agent changes both losses (the test can fail)
    action2 = batch.action.clone()
    action2[~absent] = (action2[~absent] + 1) % 2
    assert not any(torch.equal(x, y) for x, y in zip(base, losses(ReplayBatch(**{**batch.__dict__, "action": action2}))))


@pytest.mark.parametrize("algo,env", [("matd3", LEAVING), ("maddpg", TARGETS)])
def test_trained_2n_equals_n_then_resumed_bit_for_bit(algo, env, tmp_path):
    sets = [*QUIET, "eval.episodes=0", "env.num_envs=2", f"{algo}.learning_starts=40", f"{algo}.batch_size=16",
            f"{algo}.hidden=[16]"]
    a, b = trained_and_resumed(algo, env, sets, n=120, seed=3, run_dir=tmp_path / "b")
    for name in ("actor", "critics", "actor_target", "critics_target"):
        for (k, pa), pb in zip(getattr(a.algo, name).state_dict().items(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), (name, k)
    assert a.algo.grad_steps == 101  # (240 - 40) / 2 vector steps, and the one at 40


def test_cli_trains_maddpg_on_mpe_with_continuous_actions(tmp_path, capsys):
    pytest.importorskip("mpe2")
    assert main(["train", "maddpg", "mpe:simple_spread_v3", "--steps", "300", "--run-dir", str(tmp_path / "r"),
                 "--json", "--set", "env.num_envs=2", "--set", "maddpg.learning_starts=100", "--set",
                 "maddpg.batch_size=32", "--set", "maddpg.train_freq=1", "--set", "eval.episodes=2",
                 "--set", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 300 and len(summary["eval"]["agent_returns"]) == 3
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_loss" in r and "actor_loss" in r for r in rows)
    assert main(["train", "matd3", "CartPole-v1", "--steps", "10"]) == 2


def test_agent_acts_on_a_dict_of_agent_observations():
    from corral.agent import Agent

    lr = learner(env=TARGETS, sets=["maddpg.shared_actor=false"])
    agent = Agent(lr.algo, lr.cfg)
    obs = {"agent_0": np.array([0.3, 0.0], np.float32), "agent_1": np.array([-0.7, 0.0], np.float32)}
    acts = agent.act(obs)
    x = torch.zeros(1, lr.algo.layout.size)
    x[0, :4] = torch.tensor([0.3, 0.0, -0.7, 0.0])
    x[0, lr.algo.layout.mask_start:] = 1.0
    ref = lr.algo.act(x)[0]
    assert set(acts) == {"agent_0", "agent_1"} and np.allclose(acts["agent_1"], ref[1].numpy())
    assert set(agent.act({"agent_1": obs["agent_1"]})) == {"agent_1"}
    assert np.allclose(agent.act({"agent_1": obs["agent_1"]})["agent_1"], ref[1].numpy())  # own obs only


def test_learns_the_continuous_targets_game():
    """Each agent is paid ``-|a_j - c_j|`` for its observed target: a random team's return is
    -3.33 (5 steps), a perfect one's 0. Preset settings, held-out deterministic evaluation."""
    summary = Learner(build_config("maddpg", TARGETS, seed=1, sets=QUIET), None).train()
    assert summary["eval_return"] >= -1.0, summary["eval"]


def test_matd3_learns_the_leaving_game_with_gumbel_softmax():
    """Discrete actions through the straight-through Gumbel-softmax, with an agent that leaves:
    a random team's return is about 2.8 of 6, a perfect one's 6."""
    summary = Learner(build_config("matd3", LEAVING, seed=1, sets=QUIET), None).train()
    assert summary["eval_return"] >= 5.0, summary["eval"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_beats_a_random_team_on_simple_spread(algo):
    """MPE simple_spread (3 agents, continuous actions), the preset at 300k env steps, seed 0: the
    deterministic team return over 20 episodes beats a uniformly random continuous team's
    -25.26 +- 0.62 (docs/ledger.md) by 3."""
    pytest.importorskip("mpe2")
    cfg = build_config(algo, "mpe:simple_spread_v3", steps=300_000, seed=0, sets=QUIET)
    summary = Learner(cfg, None).train()
    assert summary["eval_return"] >= -22.0, summary["eval"]
