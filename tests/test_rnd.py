"""RND (corral.exploration.rnd) and ppo_rnd (corral.algos.ppo_rnd)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.exploration import RND, IntrinsicReturnNormalizer

FLAT = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
PIXELS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


# --- the RND module ---------------------------------------------------------------------

def mixed_envs_forward_filter(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """CleanRL's ppo_rnd_envpool.py: the filter is fed ``rewards.T`` ([N, T]), so each of its
    "steps" is one env's whole rollout and the running value carries from env to env."""
    rewems, out = None, []
    for row in rewards.T:
        rewems = row.clone() if rewems is None else rewems * gamma + row
        out.append(rewems)
    return torch.stack(out)


def test_intrinsic_returns_run_along_time_per_env_on_a_hand_worked_example():
    # 2 envs, 3 steps, gamma 0.5; env 0 gets 1, 0, 2 and env 1 gets 4, 4, 0
    r = torch.tensor([[1.0, 4.0], [0.0, 4.0], [2.0, 0.0]])
    norm = IntrinsicReturnNormalizer(2, gamma=0.5)
    R = norm.forward_filter(r)
    # env 0: 1, 0.5*1+0 = 0.5, 0.5*0.5+2 = 2.25; env 1: 4, 2+4 = 6, 3+0 = 3
    torch.testing.assert_close(R, torch.tensor([[1.0, 4.0], [0.5, 6.0], [2.25, 3.0]]))
    norm.update(R)
    values = np.array([1.0, 0.5, 2.25, 4.0, 6.0, 3.0])
    assert norm.stats.count.item() == 6
    np.testing.assert_allclose(norm.std.item(), np.sqrt(values.var() + 1e-8), rtol=1e-6)
    torch.testing.assert_close(norm.normalize(torch.tensor([2.0])), torch.tensor([2.0]) / norm.std)
    # the filter carries on from where the rollout ended, per env
    torch.testing.assert_close(norm.step(torch.tensor([1.0, 0.0])), torch.tensor([2.125, 1.5]))

    # the env-mixing variant: "steps" are env rows [1, 0, 2] then 0.5*[1, 0, 2] + [4, 4, 0]
    mixed = mixed_envs_forward_filter(r, 0.5)
    torch.testing.assert_close(mixed, torch.tensor([[1.0, 0.0, 2.0], [4.5, 4.0, 1.0]]))
    wrong = np.array([1.0, 0.0, 2.0, 4.5, 4.0, 1.0])
    assert abs(np.sqrt(wrong.var()) - np.sqrt(values.var())) > 0.1  # a different, wrong scale


def test_intrinsic_return_normalizer_state_round_trips():
    a = IntrinsicReturnNormalizer(3, 0.9)
    a.update(a.forward_filter(torch.rand(5, 3, generator=torch.Generator().manual_seed(0))))
    b = IntrinsicReturnNormalizer(3, 0.9)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.ret, b.ret) and torch.equal(a.std, b.std)


def test_observation_normaliser_clips_to_plus_minus_clip():
    rnd = RND(FLAT, clip=5.0)
    rnd.update_obs_norm(torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]))  # mean 1, std 1
    x = rnd.prepare(torch.tensor([[1.0, 100.0, -100.0], [3.0, 4.0, -1.0]]))
    torch.testing.assert_close(x, torch.tensor([[0.0, 5.0, -5.0], [2.0, 3.0, -2.0]]), rtol=0, atol=1e-6)
    rnd.eval()  # no statistics move in eval mode
    rnd.update_obs_norm(torch.full((4, 3), 50.0))
    assert rnd.obs_norm.count.item() == 2


def test_image_observations_use_the_newest_frame_normalised_per_pixel():
    rnd = RND(PIXELS, features=32, frames=1)
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (6, 4, 84, 84), generator=g, dtype=torch.uint8)
    assert rnd.select(obs).shape == (6, 1, 84, 84) and torch.equal(rnd.select(obs)[:, 0], obs[:, 3])
    rnd.update_obs_norm(obs)
    assert rnd.obs_norm.mean.shape == (1, 84, 84)
    x = rnd.prepare(obs)
    assert x.dtype == torch.float32 and x.abs().max() <= 5.0
    assert rnd.novelty(obs).shape == (6,)
    assert RND(PIXELS, features=32, frames=0).select(obs).shape == (6, 4, 84, 84)


def test_predictor_mask_is_reproducible_from_its_stream_and_keeps_the_fraction():
    def masks(seed):
        rnd = RND(FLAT, generator=torch.Generator().manual_seed(seed))
        return torch.stack([rnd.mask(4000, 0.25) for _ in range(3)])

    a, b, c = masks(7), masks(7), masks(8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])  # a fresh draw each call
    assert abs(a.float().mean().item() - 0.25) < 0.02


def test_predictor_loss_averages_over_the_masked_samples_only():
    g = torch.Generator().manual_seed(3)
    rnd = RND(FLAT, generator=g)
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    state = g.get_state()
    loss, trained = rnd.loss(obs, 0.5)
    g.set_state(state)
    keep = rnd.mask(64, 0.5)
    assert trained.item() == keep.sum().item()
    torch.testing.assert_close(loss, rnd.errors(obs)[keep].mean())
    torch.testing.assert_close(rnd.loss(obs, 1.0)[0], rnd.errors(obs).mean())


def test_predictor_loss_moves_only_the_predictor_never_the_target():
    for space in (FLAT, PIXELS):
        rnd = RND(space, features=16)
        obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8) if space is PIXELS else torch.randn(8, 3)
        rnd.update_obs_norm(obs)
        loss, _ = rnd.loss(obs, 1.0)
        loss.backward()
        assert all(p.grad is None and not p.requires_grad for p in rnd.target.parameters())
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rnd.predictor.parameters())


def test_novelty_of_an_observation_seen_many_times_falls_and_a_new_one_stays_high():
    torch.manual_seed(0)
    rnd = RND(FLAT, generator=torch.Generator().manual_seed(0))
    seen = torch.tensor([[0.5, -1.0, 2.0]]).repeat(32, 1)
    g = torch.Generator().manual_seed(1)
    rnd.update_obs_norm(torch.randn(256, 3, generator=g))
    new = torch.tensor([[-2.0, 2.0, -1.0]])
    before_seen, before_new = rnd.novelty(seen[:1]).item(), rnd.novelty(new).item()
    opt = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    for _ in range(200):
        loss, _ = rnd.loss(seen, 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after_seen, after_new = rnd.novelty(seen[:1]).item(), rnd.novelty(new).item()
    assert after_seen < 0.01 * before_seen
    assert after_new > 10 * after_seen


def test_rnd_state_dict_holds_networks_and_observation_statistics():
    a = RND(FLAT)
    a.update_obs_norm(torch.randn(10, 3))
    b = RND(FLAT)
    b.load_state_dict(a.state_dict())
    obs = torch.randn(5, 3)
    assert torch.equal(a.novelty(obs), b.novelty(obs))
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(a.state_dict())
