import argparse

import pytest
import torch

import corral
from corral.agent import config_from_dict
from corral.cli import main
from corral.train.checkpoint import load_checkpoint, save_checkpoint
from corral.train.learner import Learner
from corral.train.setup import build_config

FAST = ["ppo.n_steps=32", "ppo.batch_size=64", "ppo.n_epochs=2", "env.num_envs=2",
        "ppo.lr_schedule=constant", "ppo.clip_schedule=constant", "eval.episodes=0", "progress=false",
        "tensorboard=false"]


def params(algo):
    return torch.cat([p.detach().flatten() for p in algo.actor.parameters()])


def test_trained_2n_equals_trained_n_then_resumed_to_2n_bit_for_bit(tmp_path):
    n = 64 * 10
    a = Learner(build_config("ppo", "CartPole-v1", steps=2 * n, seed=7, sets=FAST + ["ppo.normalize_obs=true"]),
                tmp_path / "a")
    (tmp_path / "a" / "checkpoints").mkdir(parents=True)
    a.train()

    assert main(["train", "ppo", "CartPole-v1", "--steps", str(n), "--seed", "7", "--run-dir", str(tmp_path / "b"),
                 "--json", *sum((["--set", s] for s in FAST + ["ppo.normalize_obs=true"]), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n), "--json"]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    assert b.algo.actor.obs_norm.count.item() == a.algo.actor.obs_norm.count.item() > 0
    assert torch.equal(params(a.algo), params(b.algo))
    # corral.load builds an acting copy: the optimizer state is read from the checkpoint itself
    opt_a = a.algo.optimizer.state_dict()
    opt_b = load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")["algo"]["optimizer"]
    assert opt_a["steps"] == opt_b["steps"] > 0
    assert torch.equal(opt_a["exp_avg_sq"], opt_b["exp_avg_sq"])


def test_resume_with_a_new_lr_uses_it_and_keeps_the_optimizer_moments(tmp_path):
    """Loading an optimizer's state brings the moments back, not the saved lr: `--set` wins."""
    sets = ["dqn.learning_starts=64", "dqn.batch_size=16", "dqn.buffer_size=1000", "dqn.lr=0.001",
            "eval.episodes=0", "progress=false", "tensorboard=false"]
    run = tmp_path / "r"
    assert main(["train", "dqn", "CartPole-v1", "--steps", "300", "--seed", "3", "--run-dir", str(run), "--json",
                 *sum((["--set", s] for s in sets), [])]) == 0
    saved = load_checkpoint(run / "checkpoints" / "latest.pt")
    cfg = config_from_dict(saved["config"])
    cfg.algo_cfg.lr = 2.5e-4
    learner = Learner(cfg, tmp_path / "fresh")
    learner.load_state_dict(saved)
    opt = learner.algo.optimizer
    assert opt.lr == 2.5e-4  # the saved 1e-3 would come back without the fix
    assert opt.steps == saved["algo"]["optimizer"]["steps"] > 0
    assert torch.equal(opt.exp_avg, saved["algo"]["optimizer"]["exp_avg"])
    learner.env.close()
    # and through the CLI: the resumed run logs the new lr
    assert main(["resume", str(run), "--steps", "400", "--json", "--set", "dqn.lr=0.00025"]) == 0
    after = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert after["algo"]["optimizer"]["lr"] == 2.5e-4


def test_checkpoint_loads_weights_only_and_acts_like_the_trained_agent(tmp_path):
    agent = corral.train("ppo", "CartPole-v1", steps=512, seed=1, run_dir=str(tmp_path / "r"),
                         **{"eval.episodes": 0, "tensorboard": False})
    path = agent.save(tmp_path / "agent.pt")
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "corral-checkpoint" and raw["version"] == 1
    again = corral.load(path)
    obs = torch.randn(16, 4).numpy()
    assert (again.act(obs) == agent.act(obs)).all()
    assert again.act(obs[0]).shape == ()
    assert not list(tmp_path.glob("**/.*tmp*"))  # atomic write leaves no temp file


@pytest.mark.parametrize("damage", ["truncate", "garbage", "pickled_code"])
def test_a_corrupt_checkpoint_gives_one_clear_error_and_exit_code(tmp_path, capsys, damage):
    assert main(["train", "ppo", "CartPole-v1", "--steps", "256", "--run-dir", str(tmp_path / "r"), "--json",
                 "--set", "eval.episodes=0", "--set", "tensorboard=false"]) == 0
    ckpt = tmp_path / "r" / "checkpoints" / "latest.pt"
    data = ckpt.read_bytes()
    if damage == "truncate":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        ckpt.write_bytes(b"not a checkpoint at all")
    else:
        torch.save({"format": "corral-checkpoint", "obj": argparse.Namespace(x=1)}, ckpt)
    capsys.readouterr()
    assert main(["eval", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "corrupt or not a corral checkpoint" in err and str(ckpt) in err
    assert "Traceback" not in err


def test_checkpoint_from_a_newer_format_is_refused(tmp_path):
    save_checkpoint({"config": {}, "algo": {}}, tmp_path / "c.pt")
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    raw["version"] = 99
    torch.save(raw, tmp_path / "c.pt")
    with pytest.raises(corral.errors.UserError, match="newer than this corral"):
        load_checkpoint(tmp_path / "c.pt")


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    rc = main(["train", "ppo", "envs_for_tests:BlowUpEnv", "--steps", "4096", "--run-dir", str(tmp_path / "r"),
               "--set", "env.kwargs.after=700", "--set", "env.num_envs=1", "--set", "ppo.n_steps=128",
               "--set", "ppo.batch_size=64", "--set", "checkpoint.every=256", "--set", "tensorboard=false"])
    assert rc == 1
    assert "non-finite" in capsys.readouterr().err
    state = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert state["counters"]["env_steps"] <= 768
    flat = torch.cat([v.flatten().float() for v in state["algo"]["actor"].values()])
    assert torch.isfinite(flat).all()
    agent = corral.load(tmp_path / "r")
    assert config_from_dict(state["config"]).env.id == "envs_for_tests:BlowUpEnv"
    assert agent.act(torch.zeros(4).numpy()) in (0, 1)
