import gymnasium as gym
import numpy as np
import pytest
import torch

import corral
from corral.envs import EnvError, SyncVecEnv, make_factory, make_vec_env
from corral.errors import UserError

HERE = __file__.rsplit("/", 1)[0]


def test_gymnasium_id_gives_a_torch_batch_matching_gymnasium():
    env = make_vec_env("CartPole-v1", 3)
    obs = env.reset(seed=5)
    assert obs.shape == (3, 4) and obs.dtype == torch.float32
    for i in range(3):
        ref, _ = gym.make("CartPole-v1").reset(seed=5 + i)
        np.testing.assert_array_equal(obs[i].numpy(), ref)
    obs, rew, term, trunc, info = env.step(torch.zeros(3, dtype=torch.long))
    assert rew.dtype == torch.float32 and term.dtype == torch.bool and trunc.dtype == torch.bool
    assert info["final_obs"].shape == (3, 4)


def test_gymnasium_ids_are_built_without_pass_through_wrappers_and_step_as_gymnasium_make_does():
    """corral builds Gymnasium's own ids without OrderEnforcing and the env checker (two
    pass-through calls per step); any other registered env keeps the checker. The envs
    step exactly as ``gymnasium.make``'s, across episode ends and the time limit."""
    from gymnasium.wrappers.common import OrderEnforcing, PassiveEnvChecker

    from corral.envs.group import layers

    assert [type(x).__name__ for x in layers(make_factory("CartPole-v1")())] == ["TimeLimit", "CartPoleEnv"]
    gym.register("CorralTestCount-v0", entry_point="envs_for_tests:CountEnv", max_episode_steps=50)
    try:
        kinds = [type(x) for x in layers(make_factory("CorralTestCount-v0")())]
    finally:
        del gym.registry["CorralTestCount-v0"]
    assert PassiveEnvChecker in kinds and OrderEnforcing not in kinds

    n, limit = 3, 40
    env = make_vec_env("CartPole-v1", n, kwargs={"max_episode_steps": limit})
    obs = env.reset(seed=11)
    refs = [gym.make("CartPole-v1", max_episode_steps=limit) for _ in range(n)]
    ref_obs = [r.reset(seed=11 + i)[0] for i, r in enumerate(refs)]
    np.testing.assert_array_equal(obs.numpy(), np.stack(ref_obs))
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 2, size=(300, n)))
    ends = {"terminated": 0, "truncated": 0}
    for act in actions:
        obs, rew, term, trunc, info = env.step(act)
        for i, r in enumerate(refs):
            o, rr, te, tr, _ = r.step(int(act[i]))
            assert (rew[i].item(), term[i].item(), trunc[i].item()) == (rr, te, tr)
            np.testing.assert_array_equal(info["final_obs"][i].numpy(), o)
            if te or tr:
                ends["terminated" if te else "truncated"] += 1
                o, _ = r.reset()
            np.testing.assert_array_equal(obs[i].numpy(), o)
    assert ends["terminated"] > 5 and ends["truncated"] > 0  # both kinds of episode end were crossed


def test_truncated_episode_keeps_its_true_final_observation():
    env = make_vec_env("envs_for_tests:short_cartpole", 2, kwargs={"max_episode_steps": 3})
    env.reset(seed=0)
    ref = gym.make("CartPole-v1", max_episode_steps=3)
    ref.reset(seed=0)
    for step in range(3):
        obs, rew, term, trunc, info = env.step(torch.ones(2, dtype=torch.long))
        ref_obs, *_ = ref.step(1)
    assert trunc.tolist() == [True, True] and term.tolist() == [False, False]
    np.testing.assert_allclose(info["final_obs"][0].numpy(), ref_obs)  # the last obs of the episode
    assert not torch.equal(obs[0], info["final_obs"][0])  # obs is already the next episode's first
    assert info["episode_length"].tolist() == [3, 3]
    assert info["episode_return"].tolist() == [3.0, 3.0]


def test_episode_statistics_are_tracked_per_env():
    env = make_vec_env("envs_for_tests:make_count_env", 2, kwargs={"length": 4})
    env.reset()
    lengths = []
    for _ in range(8):
        _, _, term, trunc, info = env.step(torch.zeros(2, dtype=torch.long))
        if term.any():
            lengths += info["episode_length"][term].tolist()
            assert info["episode_return"][term].tolist() == [4.0, 4.0]
    assert lengths == [4, 4, 4, 4]


def test_user_envs_resolve_from_module_callable_file_path_class_and_instance():
    from envs_for_tests import CountEnv

    for spec in ("envs_for_tests:CountEnv", f"{HERE}/envs_for_tests.py:CountEnv", CountEnv, CountEnv(length=3)):
        env = make_vec_env(spec, 2)
        assert env.reset().shape == (2, 1)
    corral.register("count-3", lambda **kw: CountEnv(length=3, **kw))
    env = make_vec_env("count-3", 1)
    env.reset()
    for _ in range(2):
        env.step(torch.zeros(1, dtype=torch.long))
    _, _, term, _, _ = env.step(torch.zeros(1, dtype=torch.long))
    assert term.item()


def test_unknown_env_names_close_matches():
    with pytest.raises(UserError, match="did you mean CartPole-v1"):
        make_factory("CartPole-v2")
    with pytest.raises(UserError, match="has no attribute 'CountEnvv'.*CountEnv"):
        make_factory("envs_for_tests:CountEnvv")


def test_env_whose_package_is_missing_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "Box2D", None)  # look uninstalled even where it is installed
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UserError, match=r"corral\[box2d\]"):
        make_vec_env("LunarLander-v3", 1)


def test_non_finite_observation_names_env_index_and_step():
    env = make_vec_env("envs_for_tests:make_count_env", 1, kwargs={"length": 10, "bad_step": 3, "bad": "nan_obs"})
    env.reset()
    env.step(torch.zeros(1, dtype=torch.long))
    env.step(torch.zeros(1, dtype=torch.long))
    with pytest.raises(EnvError, match=r"'envs_for_tests:make_count_env' \(index 0\).*non-finite observation at vector step 2"):
        env.step(torch.zeros(1, dtype=torch.long))


def test_non_finite_reward_and_env_exceptions_are_named():
    env = make_vec_env("envs_for_tests:make_count_env", 2, kwargs={"length": 10, "bad_step": 1, "bad": "inf_reward"})
    env.reset()
    with pytest.raises(EnvError, match="non-finite reward"):
        env.step(torch.zeros(2, dtype=torch.long))
    env = make_vec_env("envs_for_tests:make_count_env", 2, kwargs={"length": 10, "bad_step": 1, "bad": "raise"})
    env.reset()
    with pytest.raises(EnvError, match=r"\(index 0\) raised at vector step 0: RuntimeError: simulator exploded"):
        env.step(torch.zeros(2, dtype=torch.long))


def test_wrong_action_shape_is_rejected_not_broadcast():
    env = make_vec_env("Pendulum-v1", 2)
    env.reset()
    with pytest.raises(EnvError, match=r"action has shape \(2,\), expected \(2, 1\)"):
        env.step(torch.zeros(2))


def test_classic_control_state_round_trips_bit_for_bit():
    a = make_vec_env("Pendulum-v1", 2)
    a.reset(seed=1)
    for _ in range(5):
        a.step(torch.rand(2, 1))
    state = a.state_dict()
    b = make_vec_env("Pendulum-v1", 2)
    b.reset(seed=99)
    assert b.load_state_dict(state)
    actions = torch.rand(250, 2, 1) * 4 - 2
    for act in actions:  # crosses the 200-step time limit, so the RNG of reset is exercised too
        ra, rb = a.step(act), b.step(act)
        assert torch.equal(ra[0], rb[0]) and torch.equal(ra[1], rb[1]) and torch.equal(ra[3], rb[3])


def test_uncopyable_env_reports_it():
    env = SyncVecEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))])
    assert env.copyable  # wrappers with plain state are fine
    from envs_for_tests import CountEnv

    env = make_vec_env(CountEnv, 1)
    assert not env.copyable
    assert env.load_state_dict(env.state_dict()) is False


def test_what_a_step_returns_is_never_overwritten_by_later_steps():
    # The in-process backend writes into rows allocated a block at a time; a consumer that
    # keeps tensors (a rollout of references, a user's list) must see them unchanged.
    env = make_vec_env("envs_for_tests:short_cartpole", 4, kwargs={"max_episode_steps": 7})
    kept, copies = [], []
    kept.append(env.reset(seed=0))
    copies.append(kept[-1].clone())
    g = torch.Generator().manual_seed(0)
    for _ in range(600):  # more than one block of rows
        obs, rew, term, trunc, info = env.step(torch.randint(0, 2, (4,), generator=g))
        step = [obs, rew, term, trunc, *info.values()]
        kept += step
        copies += [t.clone() for t in step]
        assert not term.any() or info["episode_done"].any()
        if not (term | trunc).any():
            assert info["final_obs"] is obs and not info["episode_done"].any()
    assert all(torch.equal(a, b) for a, b in zip(kept, copies))


def test_mountaincar_state_passes_a_weights_only_checkpoint_and_round_trips_bit_for_bit(tmp_path):
    # MountainCar keeps its state as a tuple of np.float64 (a Python float subclass): saved as
    # plain numbers, or torch.load(weights_only=True) refuses the whole checkpoint
    a = make_vec_env("MountainCar-v0", 2)
    a.reset(seed=1)
    for _ in range(5):
        a.step(torch.randint(0, 3, (2,)))
    torch.save(a.state_dict(), tmp_path / "env.pt")
    b = make_vec_env("MountainCar-v0", 2)
    b.reset(seed=99)
    assert b.load_state_dict(torch.load(tmp_path / "env.pt", weights_only=True))
    for act in torch.randint(0, 3, (250, 2)):
        ra, rb = a.step(act), b.step(act)
        assert torch.equal(ra[0], rb[0]) and torch.equal(ra[1], rb[1]) and torch.equal(ra[3], rb[3])
