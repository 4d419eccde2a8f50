"""pistonball_v6 at its preset (issue 38): the env's default kwargs (20 pistons, continuous
actions), 36x36 grey frames, 2 stacked, a frame skip of 4. The CI test checks what the preset
builds (its frames, its memory estimate); the learning run is marked slow."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pettingzoo.butterfly.pistonball_v6")  # pymunk comes with the multiagent extra
pytest.importorskip("cv2")

import corral  # noqa: E402
from corral.envs.multiagent import make_multiagent_vec_env, random_team_return  # noqa: E402
from corral.train.setup import build_config  # noqa: E402

ENV = "pettingzoo:butterfly.pistonball_v6"
QUIET = {"tensorboard": False, "progress": False}


@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_the_pistonball_preset_builds_small_frames_and_a_small_run(algo):
    """The preset's env: 20 agents with continuous actions (the env's defaults), each agent's
    frames 2 x 36 x 36 and the state's as large (its side is at least 36); the run's estimated
    memory is far under a gigabyte (a rollout of 2 envs x 32 steps x 20 agents, minibatches of
    320)."""
    from corral.algos.mappo_pixels import check_pixel_run

    cfg = build_config(algo, ENV)
    assert cfg.env.pixels == {"size": 36, "grey": True, "stack": 2, "skip": 4}
    assert not dict(cfg.env.kwargs)
    env = make_multiagent_vec_env(ENV, 1, dict(cfg.env.kwargs), pixels=cfg.env.pixels)
    try:
        L = env.layout
        assert L.n_agents == 20 and not L.discrete and L.frame == (2, 36, 36) and L.state_frame == (2, 36, 36)
        parts = check_pixel_run(algo, cfg.algo_cfg, L, cfg.env.num_envs, "actor", torch.device("cpu"))
        assert sum(parts.values()) < 0.5e9
    finally:
        env.close()


def test_the_pistonball_agents_see_the_ball():
    """pistonball draws its screen only with a render mode (its draw() returns at once without
    one): built as the preset builds it, each agent's frames show the drawn screen (its white
    background, mean grey level over 200, not the undrawn 75) and the pistons near the ball see
    it (their frames differ from those of pistons far from it, which see only white and pistons)."""
    cfg = build_config("ippo", ENV)
    env = make_multiagent_vec_env(ENV, 1, dict(cfg.env.kwargs), pixels=cfg.env.pixels)
    try:
        assert env.envs[0].render_mode == "rgb_array"
        frames = env.layout.split(env.reset(seed=0)).obs.reshape(20, -1).float()
        assert frames.mean() > 200
        darkest = frames.mean(1)  # the ball is blue: darker than the white background in grey
        assert darkest.max() - darkest.min() > 10
    finally:
        env.close()


@pytest.mark.slow
def test_ippo_at_the_pistonball_preset_beats_a_random_team():
    """The preset, seed 0, its 16,000 env steps (each 4 frames; about 10 CPU-minutes): held out
    on 16 episodes (seeds 10,000 on), the greedy team returns more than a random team (its episodes
    played one after another, acting every frame and holding each action 4 frames, the better of
    the two) by over 10, the sampled team by over 5 (measured: greedy +26.74, sampled +30.68,
    random -1.21 every frame and -4.46 held 4 frames; seed 0 is the weakest of seeds 0-2)."""
    cfg = build_config("ippo", ENV, seed=0, overrides={"eval.episodes": 0, **QUIET})
    assert cfg.env.pixels["skip"] == 4 and cfg.steps == 16_000
    learner = corral.Learner(cfg, None)
    summary = learner.train()
    agent = corral.Agent(learner.algo, cfg, None, summary=summary)
    greedy = corral.evaluate(agent, episodes=16, seed=10_000, deterministic=True)["mean_return"]
    sampled = corral.evaluate(agent, episodes=16, seed=10_000, deterministic=False)["mean_return"]
    kw = dict(cfg.env.kwargs)
    rnd = max(random_team_return(ENV, (), 16, 10_000, kw, num_envs=1),
              random_team_return(ENV, (), 16, 10_000, kw, num_envs=1, pixels=cfg.env.pixels))
    assert greedy > rnd + 10, (greedy, rnd)
    assert sampled > rnd + 5, (sampled, rnd)
