"""The multi-agent env layer (corral/envs/multiagent.py): PettingZoo envs vectorised with an
agent dimension, checked against PettingZoo's own stepping, with agents that leave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from ma_envs import LeavingEnv  # noqa: E402

from corral.envs import make_vec_env  # noqa: E402
from corral.envs.multiagent import AgentStep, agent_layout  # noqa: E402
from corral.errors import UserError  # noqa: E402


def test_mpe_matches_pettingzoo_stepping_the_same_seeds():
    """Packed observations, states, per-agent rewards and flags, final observations and the
    autoreset are PettingZoo's own, env for env, over several episodes."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    n, seed, steps = 3, 7, 60  # max_cycles 25: two autoresets per env
    venv = make_vec_env("mpe:simple_spread_v3", n)
    L = venv.layout
    refs = [simple_spread_v3.parallel_env() for _ in range(n)]
    ref_obs = [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)]
    view = L.split(venv.reset(seed=seed))
    for i, r in enumerate(refs):
        for j, a in enumerate(L.agents):
            np.testing.assert_array_equal(view.obs[i, j].numpy(), ref_obs[i][a])
        np.testing.assert_array_equal(view.state[i].numpy(), r.state())
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(steps):
        act = rng.integers(0, 5, (n, 3))
        obs, team, term, trunc, info = venv.step(torch.as_tensor(act))
        ag: AgentStep = info["agents"]
        view, final = L.split(obs), L.split(info["final_obs"])
        for i, r in enumerate(refs):
            o, rew, te, tr, _ = r.step({a: int(act[i, j]) for j, a in enumerate(L.agents)})
            for j, a in enumerate(L.agents):
                np.testing.assert_array_equal(final.obs[i, j].numpy(), o[a])
                assert ag.reward[i, j].item() == pytest.approx(rew[a])
                assert bool(ag.terminated[i, j]) == te[a] and bool(ag.truncated[i, j]) == tr[a]
            assert team[i].item() == pytest.approx(np.mean([rew[a] for a in L.agents]))
            if not r.agents:  # PettingZoo's episode is over: corral reset in the same step
                ends += 1
                assert bool(trunc[i]) and not bool(term[i]) and bool(info["episode_done"][i])
                o = r.reset()[0]
            else:
                assert not bool(info["episode_done"][i])
                np.testing.assert_array_equal(final.obs[i].numpy(), view.obs[i].numpy())
            for j, a in enumerate(L.agents):
                np.testing.assert_array_equal(view.obs[i, j].numpy(), o[a])
            np.testing.assert_array_equal(view.state[i].numpy(), r.state())
            assert view.agent_mask[i].all()
    assert ends == 2 * n


def test_an_agent_that_leaves_is_masked_and_no_other_agent_moves():
    env = make_vec_env(LeavingEnv, 2, multi_agent=True)
    L = env.layout
    assert L.obs_dim == 3 and L.obs_dims == (3, 3, 2) and L.n_actions == 3 and L.act_sizes == (3, 3, 2)
    assert not L.has_state and L.state_dim == 9
    v = L.split(env.reset(seed=1))
    # padding: agent_2's third observation entry is 0, its third action masked; agent_0's mask from infos
    assert (v.obs[:, 2, 2] == 0).all()
    assert v.action_mask[0].tolist() == [[True, True, False], [True, True, True], [True, True, False]]
    np.testing.assert_array_equal(v.state.numpy(), v.obs.reshape(2, 9).numpy())
    pay = lambda t: torch.tensor([[t % 2, (t + 1) % 2, t % 2]] * 2)  # noqa: E731 (the rewarded actions)
    for t in range(6):
        obs, team, term, trunc, info = env.step(pay(t))
        ag, v, final = info["agents"], L.split(obs), L.split(info["final_obs"])
        acted = torch.tensor([True, t < 3, True])
        assert ag.reward[0].tolist() == acted.float().tolist()  # everyone who acted was paid; the leaver 0 after
        assert team[0].item() == 1.0
        if t == 2:  # agent_1 terminates here: its last observation is in its slot, it acts no more
            assert ag.terminated[:, 1].all() and not ag.terminated[:, [0, 2]].any()
            assert v.agent_mask[0].tolist() == [True, False, True]
            assert v.obs[0, 1, 1].item() == pytest.approx(3 / 6)
        if 3 <= t < 5:  # absent: zeros, masked; the others' data where it always was
            assert v.agent_mask[0].tolist() == [True, False, True]
            assert (v.obs[:, 1] == 0).all() and not ag.terminated[:, 1].any()
            assert v.obs[0, 0, 1].item() == pytest.approx((t + 1) / 6) and v.obs[0, 2, 0].item() == (t + 3) % 2
        if t < 5:
            assert not info["episode_done"].any()
    # the last step: the others truncated, the episode over, autoreset with all three back
    assert ag.truncated[:, [0, 2]].all() and not ag.truncated[:, 1].any()
    assert trunc.all() and not term.any() and info["episode_done"].all()
    assert info["episode_length"].tolist() == [6, 6] and info["episode_return"].tolist() == [6.0, 6.0]
    assert info["agent_returns"][0].tolist() == [6.0, 3.0, 6.0]
    assert final.obs[0, 0, 1].item() == pytest.approx(1.0) and v.obs[0, 0, 1].item() == 0.0
    assert v.agent_mask.all()


def test_an_agent_that_vanishes_without_a_flag_is_reported_terminated():
    class Vanishing(LeavingEnv):
        def step(self, actions):
            obs, rew, te, tr, infos = super().step(actions)
            if self.t == 2:
                for d in (obs, rew, te, tr, infos):
                    d.pop("agent_2", None)
                self.agents = [a for a in self.agents if a != "agent_2"]
            return obs, rew, te, tr, infos

    env = make_vec_env(Vanishing, 1, multi_agent=True)
    env.reset(seed=0)
    env.step(torch.zeros(1, 3, dtype=torch.long))
    obs, _, _, _, info = env.step(torch.zeros(1, 3, dtype=torch.long))
    assert info["agents"].terminated[0].tolist() == [False, False, True]
    v = env.layout.split(obs)
    assert v.agent_mask[0].tolist() == [True, True, False] and (v.obs[0, 2] == 0).all()
    obs, _, _, _, info = env.step(torch.zeros(1, 3, dtype=torch.long))  # agent_2 is given no action
    assert not info["agents"].terminated[0, 2] and info["agents"].reward[0, 2] == 0


def test_aec_envs_are_converted_and_specs_resolve():
    pytest.importorskip("mpe2")
    from mpe2 import simple_adversary_v3

    aec = make_vec_env(simple_adversary_v3.env(), 2)  # an AEC instance: PettingZoo's aec_to_parallel
    assert aec.layout.agents == ("adversary_0", "agent_0", "agent_1") and aec.layout.obs_dims == (8, 10, 10)
    assert aec.layout.has_state
    env = make_vec_env("mpe:simple_tag_v3", 1, {"max_cycles": 5})
    env.reset(seed=0)
    for _ in range(5):
        _, _, _, trunc, info = env.step(torch.zeros(1, env.layout.n_agents, dtype=torch.long))
    assert trunc.all() and info["episode_length"].item() == 5
    env = make_vec_env("tests/ma_envs.py:LeavingEnv", 1, {"horizon": 4}, multi_agent=True)
    assert agent_layout(env.single_observation_space) is env.layout
    with pytest.raises(UserError, match="did you mean mpe:simple_spread_v3"):
        make_vec_env("mpe:simple_sprad_v3", 1)
    with pytest.raises(UserError, match="not a PettingZoo"):
        make_vec_env("CartPole-v1", 1, multi_agent=True)


def test_episode_cap_truncates_every_agent_and_wrong_actions_are_named():
    env = make_vec_env(LeavingEnv, 2, {"horizon": 100}, multi_agent=True, max_episode_steps=4)
    env.reset(seed=0)
    for _ in range(4):
        _, _, term, trunc, info = env.step(torch.zeros(2, 3, dtype=torch.long))
    assert trunc.all() and not term.any() and info["agents"].truncated[0].tolist() == [True, False, True]
    from corral.envs.base import EnvError

    with pytest.raises(EnvError, match="expected \\(2, 3\\)"):
        env.step(torch.zeros(2, dtype=torch.long))
    with pytest.raises(EnvError, match="agent 'agent_2'"):
        env.step(torch.tensor([[0, 0, 2], [0, 0, 0]]))


def test_state_dict_continues_the_same_episodes():
    a = make_vec_env(LeavingEnv, 2, multi_agent=True)
    b = make_vec_env(LeavingEnv, 2, multi_agent=True)
    assert a.copyable
    a.reset(seed=3)
    for _ in range(4):
        a.step(torch.ones(2, 3, dtype=torch.long))
    b.reset(seed=99)
    assert b.load_state_dict(a.state_dict())
    for _ in range(9):
        oa, ra, *_ , ia = a.step(torch.ones(2, 3, dtype=torch.long))
        ob, rb, *_ , ib = b.step(torch.ones(2, 3, dtype=torch.long))
        assert torch.equal(oa, ob) and torch.equal(ra, rb) and torch.equal(ia["episode_return"], ib["episode_return"])


def test_mpe_env_state_restores_episodes_mid_way_bit_for_bit():
    """An MPE env's saved state (``corral.envs.mpe``) put into a fresh env continues the same
    episode: the same observations, rewards and flags, through a reset (the RNG state)."""
    pytest.importorskip("mpe2")
    from corral.envs.multiagent import ParallelFactory

    make = ParallelFactory("mpe:simple_adversary_v3", {"max_cycles": 12})
    a, b = make(), make()
    a.reset(seed=1)
    b.reset(seed=99)  # another episode entirely
    rng = np.random.default_rng(0)

    def acts(env):
        return {ag: int(rng.integers(5)) for ag in env.agents}

    for _ in range(5):
        a.step(acts(a))
    b.corral_load_state(a.corral_state())
    for t in range(12):
        if not a.agents:
            oa, _ = a.reset()
            ob, _ = b.reset()  # no seed: the restored np_random draws the same next episode
            assert all(np.array_equal(oa[k], ob[k]) for k in oa)
            continue
        act = acts(a)
        ra, rb = a.step(act), b.step(act)
        for da, db in zip(ra, rb):
            assert da.keys() == db.keys()
            for k in da:
                if isinstance(da[k], np.ndarray):
                    assert np.array_equal(da[k], db[k]), (t, k)
                else:
                    assert da[k] == db[k], (t, k)
    assert np.array_equal(a.state(), b.state())
