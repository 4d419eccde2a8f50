"""Competitive teams: per-agent rewards in the replay (n-step per agent), MADDPG / MATD3 with a
critic head per agent (``rewards=agent``), fixed random opponents (``env.opponents``): who
acts, determinism, exact resume, refusals; self-play runs; each side of simple_tag learns
against a random opponent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from envs_for_tests import trained_and_resumed  # noqa: E402

from corral.algos.offpolicy import drive  # noqa: E402
from corral.cli import main  # noqa: E402
from corral.envs.multiagent import make_multiagent_vec_env  # noqa: E402
from corral.errors import UserError  # noqa: E402
from corral.storage.replay import ReplayBuffer  # noqa: E402
from corral.train.learner import Learner  # noqa: E402
from corral.train.setup import build_config  # noqa: E402

QUIET = ["progress=false", "tensorboard=false"]
LEAVING = "tests/ma_envs.py:LeavingEnv"
TARGETS = "tests/ma_envs.py:TargetsEnv"


def test_per_agent_rewards_take_the_same_n_step_sums_as_one_buffer_per_agent():
    obs, act = gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(2)
    A, N, n, g = 3, 2, 3, 0.9
    joint = ReplayBuffer(64, N, obs, act, n_step=n, gamma=g, reward_shape=(A,), seed=0)
    single = [ReplayBuffer(64, N, obs, act, n_step=n, gamma=g, seed=0) for _ in range(A)]
    rng = np.random.default_rng(0)
    for t in range(20):
        o, r = torch.full((N, 1), float(t)), torch.tensor(rng.normal(size=(N, A)), dtype=torch.float32)
        term = torch.tensor([t % 7 == 6, False])
        trunc = torch.tensor([False, t % 5 == 4])
        args = (o, torch.zeros(N, dtype=torch.long))
        joint.add(*args, r, term, trunc, o + 0.5)
        for a in range(A):
            single[a].add(*args, r[:, a], term, trunc, o + 0.5)
    idx = torch.arange(0, 30)
    iw = torch.linspace(0.1, 1.0, 30)  # importance weights pass through the n-step sums untouched
    b = joint._gather(idx, iw)
    assert b.reward.shape == (30, A) and torch.equal(b.weights, iw)
    assert torch.equal(single[0]._gather(idx, iw).weights, iw)
    for a in range(A):
        s = single[a]._gather(idx, torch.ones(30))
        assert torch.allclose(b.reward[:, a], s.reward) and torch.equal(b.discount, s.discount)
    assert ReplayBuffer(64, N, obs, act).nbytes < joint.nbytes  # the memory check counts the agents' rewards
    state = joint.state_dict()
    with pytest.raises(ValueError, match="reward_shape"):
        ReplayBuffer(64, N, obs, act, n_step=n, gamma=g).load_state_dict(state)


def maddpg(env=TARGETS, steps=80, sets=(), algo="maddpg"):
    lr = Learner(build_config(algo, env, steps=steps, seed=0, sets=[
        *QUIET, "eval.episodes=0", "env.num_envs=2", f"{algo}.learning_starts=40", f"{algo}.batch_size=16",
        f"{algo}.hidden=[16]", f"{algo}.rewards=agent", *sets]), None)
    lr.train()
    return lr.algo


class PerAgentLinear(torch.nn.Module):
    """Known critics with one head per agent: ``Q_i = (i + 1) * sum(a)`` for every critic."""

    def __init__(self, n, A):
        super().__init__()
        self.n, self.A = n, A

    def forward(self, x, a):
        heads = torch.arange(1, self.A + 1, dtype=a.dtype)
        return (a.sum(-1, keepdim=True) * heads).expand(self.n, *a.shape[:-1], self.A)


def test_each_agent_head_learns_its_own_reward():
    algo = maddpg()
    A = algo.layout.n_agents
    batch = algo.replay.sample(16)
    assert batch.reward.shape == (16, A)
    # the replay holds each agent's own reward, not the team's mean
    stored = algo.replay._reward[:algo.replay._rows_filled]
    assert stored.shape[-1] == A and not torch.allclose(stored[..., 0], stored[..., 1])
    algo.critics_target = PerAgentLinear(1, A)
    nxt = algo.layout.split(batch.next_obs)
    s = algo.joint(algo.target_actions(nxt, {}), nxt.agent_mask).sum(-1, keepdim=True)
    expected = batch.reward + batch.discount[:, None] * s * torch.arange(1, A + 1)
    assert torch.allclose(algo.td_target(batch, {}), expected)
    # agent 1's reward moves agent 1's target and loss only
    noise = algo.draw_noise(16)
    t0 = algo.td_target(batch, noise)
    batch.reward[:, 1] += 5.0
    t1 = algo.td_target(batch, noise)
    assert torch.equal(t0[:, 0], t1[:, 0]) and torch.allclose(t1[:, 1] - t0[:, 1], torch.full((16,), 5.0))


def test_agent_i_actor_ascends_its_own_head():
    """The actor loss reads head i for agent i's variant: a critic whose head 1 ignores agent
    1's action gives agent 1's actor no gradient from Q."""
    algo = maddpg()
    A, K = algo.layout.n_agents, algo.layout.n_actions

    class Heads(torch.nn.Module):  # Q_i = sum of the actions of agents other than i (x ignored)
        def forward(self, x, a):
            a = a.view(*a.shape[:-1], A, K).sum(-1)
            return (a.sum(-1, keepdim=True) - a).unsqueeze(0)

    algo.critics = Heads()
    algo.cfg.action_reg = 0.0
    algo.grad_steps = 0
    batch = algo.replay.sample(16)
    gen = algo.phases(batch, algo.draw_noise(16))
    next(gen)
    _, loss = gen.send(None)
    pre = None
    grads = torch.autograd.grad(loss, list(algo.actor.parameters()), allow_unused=True)
    assert all(g is None or float(g.abs().sum()) == 0.0 for g in grads)  # no agent moves its own Q
    del pre


def test_critic_and_actor_losses_stay_apart_with_per_agent_heads():
    algo = maddpg(LEAVING, steps=100, algo="matd3", sets=["matd3.policy_delay=1"])
    batch = algo.replay.sample(16)
    groups = {n: list(getattr(algo, n).parameters()) for n in ("actor", "critics")}
    seen = []

    def step(opt, loss):
        for ps in groups.values():
            for p in ps:
                p.grad = None
        loss.backward()
        seen.append({n: any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in ps)
                     for n, ps in groups.items()})

    drive(algo.phases(batch, algo.draw_noise(16)), step)
    assert seen == [{"actor": False, "critics": True}, {"actor": True, "critics": False}]


def test_random_opponents_leave_the_env_and_act_at_random_reproducibly():
    pytest.importorskip("mpe2")
    env = make_multiagent_vec_env("mpe:simple_tag_v3", 2, opponents=("agent_*",))
    assert env.layout.agents == ("adversary_0", "adversary_1", "adversary_2")
    inner = env.envs[0]

    def rollout(seed):
        env.reset(seed=seed)
        acts, rews = [], []
        g = torch.Generator().manual_seed(0)
        for _ in range(30):
            _, r, *_ = env.step(torch.randint(0, 5, (2, 3), generator=g))
            rews.append(r.clone())
            acts.append(np.array(inner.env.aec_env.unwrapped.world.agents[3].action.u))
        return np.stack(acts), torch.stack(rews)

    a1, r1 = rollout(1)
    a2, r2 = rollout(1)
    a3, _ = rollout(2)
    assert np.array_equal(a1, a2) and torch.equal(r1, r2)
    assert not np.array_equal(a1, a3)  # the opponent's draws follow the seed
    assert len({tuple(u) for u in a1}) > 2  # and vary: a random prey, not a fixed action
    env.close()


def test_random_opponents_use_an_action_mask():
    class Masked:
        possible_agents = ["me", "them"]

        def __init__(self):
            self.agents, self.seen = [], []

        def observation_space(self, a):
            return gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (2,)),
                                    "action_mask": gym.spaces.MultiBinary(4)})

        def action_space(self, a):
            return gym.spaces.Discrete(4)

        def _obs(self):
            mask = np.array([0, 1, 0, 1], np.int8)
            return {a: {"observation": np.zeros(2, np.float32), "action_mask": mask} for a in self.agents}

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            return self._obs(), {a: {} for a in self.agents}

        def step(self, actions):
            self.seen.append(actions["them"])
            z = {a: 0.0 for a in self.agents}
            return self._obs(), z, {a: False for a in self.agents}, {a: False for a in self.agents}, \
                {a: {} for a in self.agents}

    from corral.envs.opponents import RandomOpponents

    env = RandomOpponents(Masked(), ["them"])
    assert env.possible_agents == ["me"]
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["me"]
    for _ in range(40):
        env.step({"me": 0})
    assert set(env.env.seen) == {1, 3}


def test_opponents_are_refused_by_name(capsys):
    pytest.importorskip("mpe2")
    with pytest.raises(UserError, match="names no agent.*adversary_0"):
        make_multiagent_vec_env("mpe:simple_tag_v3", 1, opponents=("prey_*",))
    with pytest.raises(UserError, match="names every agent"):
        make_multiagent_vec_env("mpe:simple_tag_v3", 1, opponents=("*",))
    assert main(["train", "ppo", "CartPole-v1", "--steps", "100", "--set", "env.opponents=[x]", *sum(
        (["--set", s] for s in QUIET), [])]) != 0
    assert "env.opponents applies to multi-agent envs" in capsys.readouterr().err


def test_a_run_against_random_opponents_resumes_bit_for_bit(tmp_path):
    pytest.importorskip("mpe2")
    sets = [*QUIET, "eval.episodes=0", "env.num_envs=2", "maddpg.learning_starts=40", "maddpg.batch_size=16",
            "maddpg.hidden=[16]", "maddpg.rewards=agent", "env.opponents=[agent_0]"]
    a, b = trained_and_resumed("maddpg", "mpe:simple_tag_v3", sets, n=60, seed=1, run_dir=tmp_path / "b")
    for name in ("actor", "critics", "actor_target", "critics_target"):
        for pa, pb in zip(getattr(a.algo, name).state_dict().values(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), name


@pytest.mark.parametrize("algo", ["maddpg", "matd3", "ippo"])
def test_self_play_with_per_agent_rewards_runs(algo, tmp_path):
    pytest.importorskip("mpe2")
    sets = [*QUIET, "eval.episodes=2", "env.num_envs=2"]
    if algo != "ippo":
        sets += [f"{algo}.rewards=agent", f"{algo}.learning_starts=50", f"{algo}.batch_size=32"]
    else:
        sets += ["ippo.n_steps=25"]
    summary = Learner(build_config(algo, "mpe:simple_tag_v3", steps=300, seed=0, sets=sets), None).train()
    assert np.isfinite(summary["eval_return"])


@pytest.mark.parametrize("side,opponents,margin", [("good agents", ["adversary_*"], 4.0),
                                                     ("adversary", ["agent_*"], 5.0)])
def test_each_side_of_simple_adversary_beats_a_random_team(side, opponents, margin):
    """ippo at its simple_adversary preset for 30k steps, seed 0, against a random opponent: the
    final policy on 50 held-out episodes beats a random team's return under the same protocol
    (measured: good agents +9.4, adversary +13.4 at this budget)."""
    pytest.importorskip("mpe2")
    import corral
    from corral.envs.multiagent import random_team_return

    agent = corral.train("ippo", "mpe:simple_adversary_v3", steps=30_000, seed=0, save_run=False,
                         **{"env.opponents": opponents})
    ev = corral.evaluate(agent, episodes=50, seed=10_000)
    base = random_team_return("mpe:simple_adversary_v3", tuple(opponents), 50, 10_000)
    assert ev["mean_return"] >= base + margin, (side, ev["mean_return"], base)


def test_per_agent_heads_with_one_trained_agent_are_the_team_critic():
    """One agent left to train (the prey against random predators): its own reward is the team's,
    so rewards=agent trains exactly what rewards=team does."""
    pytest.importorskip("mpe2")

    def run(rewards):
        lr = Learner(build_config("maddpg", "mpe:simple_tag_v3", steps=300, seed=0, sets=[
            *QUIET, "eval.episodes=0", "maddpg.learning_starts=100", "maddpg.batch_size=32", "maddpg.hidden=[16]",
            f"maddpg.rewards={rewards}", "env.opponents=[adversary_*]"]), None)
        lr.train()
        return lr.algo

    a, b = run("team"), run("agent")
    assert a.grad_steps == b.grad_steps > 0
    for x, y in zip(a.synced_tensors(), b.synced_tensors()):
        assert torch.equal(x, y)
