"""The native torch-batched DeepSea against the Gymnasium one (corral.envs.deepsea), step for step."""

import numpy as np
import pytest
import torch

from corral.envs import make_vec_env
from corral.envs.deepsea import DeepSea as GymDeepSea
from corral.envs.native import DEEPSEA_ENVS, make_native
from corral.envs.native.deepsea import DeepSea

torch.set_num_threads(1)


@pytest.mark.parametrize("size,mapping_seed", [(6, 0), (12, 3)])
def test_matches_gymnasium_step_by_step(size, mapping_seed):
    """K Gymnasium envs (reset by hand at each end) and a native batch of K, the same random
    actions, biased to "right" so that the treasure is reached: every observation, reward,
    termination, final observation and episode return agrees."""
    K, steps = 16, 40 * size
    gyms = [GymDeepSea(size, mapping_seed=mapping_seed) for _ in range(K)]
    obs_g = np.stack([e.reset(seed=i)[0] for i, e in enumerate(gyms)])
    native = DeepSea(K, size=size, mapping_seed=mapping_seed, seed=0)
    obs_n = native.reset(seed=0)
    assert native.single_observation_space == gyms[0].observation_space
    assert native.single_action_space == gyms[0].action_space
    rng = np.random.default_rng(0)
    returns, treasures = np.zeros(K), 0
    for _ in range(steps):
        np.testing.assert_array_equal(obs_n.numpy(), obs_g)
        # "right" with probability 0.9 per cell, so some episodes go right all the way
        right = np.array([e.right_action(e.row, e.column) for e in gyms])
        action = np.where(rng.random(K) < 0.9, right, 1 - right)
        obs_n, r_n, term_n, trunc_n, info = native.step(torch.as_tensor(action))
        nxt = []
        for i, e in enumerate(gyms):
            o, r, term, trunc, _ = e.step(int(action[i]))
            returns[i] += r
            treasures += r > 0.5
            assert r_n[i].item() == np.float32(r) and bool(term_n[i]) == term and bool(trunc_n[i]) == trunc
            if term:
                np.testing.assert_array_equal(info["final_obs"][i].numpy(), o)  # all zeros
                assert info["episode_return"][i].item() == pytest.approx(returns[i], abs=1e-6)
                assert info["episode_length"][i].item() == size
                returns[i] = 0.0
                o, _ = e.reset()
            nxt.append(o)
        obs_g = np.stack(nxt)
    assert treasures > 5  # the rewarding corner was compared too


def test_native_deepsea_ids_route_and_resume_from_a_state_dict():
    assert set(DEEPSEA_ENVS) >= {"DeepSea12-v0", "DeepSea20-v0"}
    env = make_vec_env("native:DeepSea12-v0", num_envs=3)
    assert env.single_observation_space.shape == (12, 12) and env.num_envs == 3
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        env.step(torch.randint(2, (3,), generator=g))
    twin = make_native("DeepSea12-v0", 3, seed=0)
    twin.load_state_dict(env.state_dict())
    for _ in range(20):
        a = torch.randint(2, (3,), generator=g)
        for x, y in zip(env.step(a)[:4], twin.step(a)[:4]):
            assert torch.equal(x, y)
