"""Dict / Tuple observations (flattened with a layout), image parts through a CNN, and
Discrete action masking from an 'action_mask' observation part."""

import gymnasium as gym
import numpy as np
import torch

import corral
from corral.envs import make_vec_env
from corral.envs.spaces import layout_of


class MaskedEnv(gym.Env):
    """5 actions; each step only 2 are allowed (given in obs['action_mask']). Reward 1 for
    the allowed action named by obs['target'] (one-hot), -1 for a masked one."""

    def __init__(self, with_image: bool = False):
        parts = {"target": gym.spaces.Discrete(5), "noise": gym.spaces.Box(-1, 1, (3,), np.float32),
                 "action_mask": gym.spaces.MultiBinary(5)}
        if with_image:
            parts["frame"] = gym.spaces.Box(0, 255, (1, 36, 36), np.uint8)
        self.observation_space = gym.spaces.Dict(parts)
        self.action_space = gym.spaces.Discrete(5)
        self.with_image = with_image
        self.masked_taken = 0

    def _obs(self):
        allowed = self.np_random.choice(5, 2, replace=False)
        self.mask = np.zeros(5, np.int8)
        self.mask[allowed] = 1
        self.target = int(allowed[0])
        obs = {"target": self.target, "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32),
               "action_mask": self.mask.copy()}
        if self.with_image:
            obs["frame"] = np.full((1, 36, 36), 40 * self.target, np.uint8)
        return obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if not self.mask[action]:
            self.masked_taken += 1
            r = -1.0
        else:
            r = float(action == self.target)
        return self._obs(), r, False, self.t >= 20, {}


def test_dict_observations_arrive_flat_with_a_layout():
    env = make_vec_env(MaskedEnv, 2)
    obs = env.reset(seed=0)
    layout = layout_of(env.single_observation_space)
    assert [p.key for p in layout] == ["action_mask", "noise", "target"]  # gymnasium's Dict sorts keys
    assert obs.shape == (2, 5 + 3 + 1) and obs.dtype == torch.float32
    target = next(p for p in layout if p.key == "target")
    assert (target.start, target.stop, target.nvec) == (8, 9, (5,))  # one slot holding the integer
    assert torch.equal(obs[:, 8], obs[:, 8].round()) and bool(((obs[:, 8] >= 0) & (obs[:, 8] < 5)).all())


def test_masked_actions_are_never_sampled_and_ppo_learns_the_allowed_target():
    agent = corral.train("ppo", MaskedEnv, steps=6000, seed=0, save_run=False,
                         **{"eval.episodes": 0, "tensorboard": False, "ppo.n_steps": 200, "ppo.batch_size": 100,
                            "ppo.lr": 3e-3, "ppo.normalize_obs": True})
    env = make_vec_env(MaskedEnv, 1)
    obs = env.reset(seed=3)
    for _ in range(200):  # stochastic actions from the trained policy respect the mask
        a = agent.algo.act(obs, deterministic=False)
        assert obs[0, a.item()] == 1.0  # the action_mask part comes first
        obs, *_ = env.step(a)
    res = corral.evaluate(agent, MaskedEnv(), episodes=5)
    assert res["mean_return"] >= 18, res  # 20 steps, nearly always the target


def test_image_parts_of_a_dict_go_through_their_own_cnn():
    agent = corral.train("ppo", MaskedEnv, steps=400, seed=0, save_run=False,
                         **{"env.kwargs.with_image": True, "eval.episodes": 0, "tensorboard": False,
                            "ppo.n_steps": 100, "ppo.batch_size": 50})
    enc = agent.actor.parts
    assert len(enc.cnns) == 1 and enc.out_dim == 5 + 3 + 5 + 512
    obs = make_vec_env(MaskedEnv, 1, kwargs={"with_image": True}).reset(seed=0)
    frame = next(p for p in layout_of(agent.algo.obs_space) if p.key == "frame")
    x = agent.actor.normalize(obs)
    assert torch.equal(x[0, frame.start:frame.stop], obs[0, frame.start:frame.stop])  # raw pixels for the CNN
