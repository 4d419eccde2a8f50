"""The Learner driven one update at a time (``start``, ``step``, ``done``, ``print_info``,
``save_model``, ``evaluate``, ``close``) is the same run as ``train()``."""

import torch

import corral
from corral.train.learner import Learner
from corral.train.setup import build_config, new_run_dir

SETS = ["ppo.n_steps=32", "ppo.batch_size=64", "env.num_envs=4", "eval.every=1024", "eval.episodes=3",
        "progress=false", "tensorboard=false"]


def params(learner):
    return torch.cat([p.detach().flatten() for p in learner.algo.actor.parameters()])


def test_a_stepped_learner_gives_the_same_run_as_train(tmp_path, capsys):
    a = Learner(build_config("ppo", "CartPole-v1", steps=4096, seed=3, sets=SETS), None)
    whole = a.train()
    cfg = build_config("ppo", "CartPole-v1", steps=4096, seed=3, sets=SETS)
    b = Learner(cfg, new_run_dir(cfg, str(tmp_path / "b")))
    b.start()
    updates = 0
    while not b.done():
        stats = b.step()
        if stats is None:
            break
        updates += 1
        assert "pg_loss" in stats
        b.print_info()
    stepped = b.close()
    assert updates == 4096 // (32 * 4) == b.updates
    assert torch.equal(params(a), params(b))
    for k in ("env_steps", "episodes", "last20_return", "eval_return", "stopped_early"):
        assert whole[k] == stepped[k], k
    assert [e["eval_return"] for e in a.eval_history] == [e["eval_return"] for e in b.eval_history]
    out = capsys.readouterr().out
    assert "4,096/4,096 steps, 32 updates" in out and "eval" in out
    assert b.step() is None  # a finished run does nothing more


def test_save_model_and_evaluate_on_a_stepped_run(tmp_path):
    cfg = build_config("ppo", "CartPole-v1", steps=1024, seed=0, sets=SETS)
    L = Learner(cfg, new_run_dir(cfg, str(tmp_path / "r")))
    L.start()
    L.step()
    result = L.evaluate()
    assert result["episodes"] == 3 and L.last_eval is result
    path = L.save_model()
    assert path.name == "latest.pt"
    again = corral.load(path)
    obs = torch.randn(5, 4).numpy()
    assert (again.act(obs) == corral.load(L.save_model(tmp_path / "x.pt")).act(obs)).all()
    L.close()


def test_an_early_stop_ends_a_stepped_run_as_it_ends_train():
    over = SETS + ["eval.stop_at_return=0"]  # the first evaluation stops the run
    a = Learner(build_config("ppo", "CartPole-v1", steps=8192, seed=1, sets=over), None)
    summary = a.train()
    b = Learner(build_config("ppo", "CartPole-v1", steps=8192, seed=1, sets=over), None).start()
    while b.step() is not None and not b.done():
        pass
    assert b.done() and b.close()["stopped_early"] and summary["stopped_early"]
    assert a.env_steps == b.env_steps == 1024


def test_a_users_feature_extractor_is_the_encoder():
    """PPO with the encoder replaced by a user's nn.Module class (passed as the class from
    Python; the config records it as 'module:qualname', so collectors and checkpoints rebuild
    it). That such a run learns CartPole to >= 475 held out is docs/tutorial.md's test
    (tests/test_docs.py), with the same extractor."""
    from envs_for_tests import TinyExtractor

    agent = corral.train("ppo", "CartPole-v1", steps=2048, seed=0, save_run=False,
                         **{"features": TinyExtractor, "eval.episodes": 0, "tensorboard": False, "progress": False})
    assert agent.cfg.algo_cfg.features == "envs_for_tests:TinyExtractor"
    assert isinstance(agent.algo.actor.extractor, TinyExtractor)
    assert agent.algo.actor.body.weights[0].shape[-1] == 32  # the heads read its 32 features


def test_a_bad_feature_extractor_is_refused_with_the_fix(capsys):
    from corral.cli import main

    assert main(["train", "ppo", "CartPole-v1", "--steps", "64", "--set", "ppo.features=envs_for_tests:nothing"]) != 0
    assert "ppo.features" in capsys.readouterr().err
    assert main(["train", "ppo", "CartPole-v1", "--steps", "64", "--set", "ppo.features=envs_for_tests:CountEnv"]) != 0
    assert "out_dim" in capsys.readouterr().err


def test_a_users_algorithm_and_storage_from_their_module_run_from_the_cli(tmp_path, capsys):
    import json
    import os

    from corral.cli import main

    plugin = os.path.join(os.path.dirname(__file__), "user_plugins", "my_algos.py")
    assert main(["train", "counting_ppo", "CartPole-v1", "--import", plugin, "--steps", "512", "--run-dir",
                 str(tmp_path / "r"), "--json", "--set", "ppo.n_steps=32", "--set", "env.num_envs=4",
                 "--set", "eval.episodes=2", "--set", "tensorboard=false"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["env_steps"] == 512
    agent = corral.load(tmp_path / "r")  # the run's config names the module: load imports it again
    assert type(agent.algo).__name__ == "CountingPPO" and agent.cfg.imports == (plugin,)
    assert main(["resume", str(tmp_path / "r"), "--steps", "1024"]) == 0
    # with collectors in this process, built from the config, the user's algorithm exists there too
    from corral.schemes.collector import Collector, driver_paths

    c = Collector(agent.cfg, "CartPole-v1", 0, 1, paths=driver_paths())
    assert type(c.algo).__name__ == "CountingPPO"
    # from Python, the same through imports=: the user's storage is the one that was filled
    trained = corral.train("counting_ppo", "CartPole-v1", steps=256, save_run=False, imports=(plugin,),
                           **{"ppo.n_steps": 32, "env.num_envs": 4, "eval.episodes": 0, "tensorboard": False})
    assert type(trained.algo.storage).__name__ == "CountingStorage" and trained.algo.storage.added == 256 // 4
    assert main(["train", "counting_ppo", "CartPole-v1", "--import", "no_such_plugin_module", "--steps", "64"]) != 0
    assert "no_such_plugin_module" in capsys.readouterr().err
