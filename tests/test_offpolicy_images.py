"""SAC and TD3 (and DDPG) on image observations: uint8 pixels in the replay, a Nature CNN
for the actor trained by the actor loss, one for the critics trained by the critic loss,
and SAC learning a task it can only solve by reading the pixels."""

import pytest
import torch

import corral
from corral.algos.base import Step
from corral.train.learner import Learner
from corral.train.setup import build_config

ENV = "envs_for_tests:PixelTarget"
QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def learner(algo, env=ENV, **over):
    cfg = build_config(algo, env, steps=2000, seed=0,
                       overrides={**QUIET, f"{algo}.hidden": [64], f"{algo}.batch_size": 32,
                                  f"{algo}.learning_starts": 64, **over})
    return Learner(cfg, None, env_spec=env, quiet=True)


def grads_of(enc):
    """Gradient mass on each weight of an encoder's CNN(s)."""
    return [p.grad.abs().sum().item() if p.grad is not None else 0.0 for p in enc.parameters()]


@pytest.mark.parametrize("algo,env", [("sac", ENV), ("td3", ENV), ("ddpg", ENV),
                                      ("sac", "envs_for_tests:PixelTargetDict"), ("td3", "envs_for_tests:PixelTargetDict")])
def test_each_cnn_is_trained_by_its_own_loss(algo, env):
    L = learner(algo, env, **{f"{algo}.policy_delay": 1} if algo != "ddpg" else {})
    a = L.algo
    if env == ENV:
        assert a.replay.obs_dtype == torch.uint8  # pixels stay bytes in the replay
        assert a.actor.enc.cnn is not None and a.critics.enc.cnn is not None
    else:  # a Dict: the image part through a CNN of each encoder's own, the vector part as it is
        assert len(a.actor.enc.parts.cnns) == len(a.critics.enc.parts.cnns) == 1
        assert a.actor.enc.dim == a.critics.enc.dim == 512 + 2
    assert {id(p) for p in a.actor.parameters()}.isdisjoint(id(p) for p in a.critics.parameters())
    env, obs = L.env, L.obs
    with torch.no_grad():
        for _ in range(80):
            act, ex = a.explore(obs)
            nxt, r, te, tr, info = env.step(act)
            a.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
            obs = nxt
    batch = a.replay.sample(16)
    phases = a.phases(batch, a.draw_noise(16))
    opt, critic_loss = next(phases)
    assert opt is a.critic_opt
    opt.zero_grad()
    a.actor_opt.zero_grad()
    critic_loss.backward()
    assert all(g > 0 for g in grads_of(a.critics.enc))  # the critics' CNN learns from it
    assert not any(g > 0 for g in grads_of(a.actor.enc))  # the actor's does not
    opt.step()
    opt, actor_loss = phases.send(None)
    assert opt is a.actor_opt
    a.actor_opt.zero_grad()
    a.critic_opt.zero_grad()
    actor_loss.backward()
    assert all(g > 0 for g in grads_of(a.actor.enc))
    assert not any(g > 0 for g in grads_of(a.critics.enc))


def test_sac_learns_to_read_the_pixels(tmp_path):
    agent = corral.train("sac", ENV, steps=2500, seed=0, save_run=False,
                         **{**QUIET, "sac.hidden": [64], "sac.batch_size": 64, "sac.learning_starts": 200,
                            "sac.lr": 1e-3})
    ret = corral.evaluate(agent, ENV, episodes=100, seed=1)["mean_return"]
    # a constant action scores -0.5 at best; only a policy that reads the column does better
    assert ret >= -0.2, ret


def test_sac_runs_on_car_racing_rgb_frames(tmp_path):
    pytest.importorskip("Box2D")
    agent = corral.train("sac", "CarRacing-v3", steps=300, seed=0, run_dir=str(tmp_path / "r"),
                         **{**QUIET, "sac.hidden": [64], "sac.batch_size": 16, "sac.learning_starts": 200,
                            "sac.buffer_size": 1000})
    assert agent.summary["env_steps"] == 300
    assert agent.actor.enc.cnn.channels_last  # 96x96x3, read channels last
    state = torch.load(tmp_path / "r" / "checkpoints" / "latest.pt", weights_only=True)
    assert any(k.startswith("enc.cnn.") for k in state["algo"]["critics"])  # the critics' own CNN is saved
