"""Logging: TensorBoard groups (learner / actor per collector / train / eval), run tags,
terminal-state screenshots, Monitor CSVs, and MLflow / W&B writing the same metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import corral
from corral.cli import main
from corral.errors import UserError
from corral.train.learner import Learner
from corral.train.loggers import board_tag
from corral.train.setup import build_config, new_run_dir

QUIET = {"progress": False, "eval.episodes": 0}


def events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def learner(algo="ppo", env="CartPole-v1", steps=2048, run_dir=None, **overrides):
    cfg = build_config(algo, env, steps=steps, overrides={**QUIET, **overrides})
    return Learner(cfg, new_run_dir(cfg, str(run_dir)) if run_dir else None, env_spec=env, quiet=True)


def test_metric_names_are_grouped_for_tensorboard():
    assert board_tag("collector0_sps") == "actor/0/steps_per_s"
    assert board_tag("collector12_episode_return") == "actor/12/episode_return"
    assert board_tag("pg_loss") == "learner/pg_loss"
    assert board_tag("lr") == "learner/lr"
    assert board_tag("updates") == "learner/updates"
    assert board_tag("policy_lag") == "scheme/policy_lag"
    assert board_tag("episode_return") == "train/episode_return"
    assert board_tag("eval_return") == "eval/return"


def test_in_process_run_has_learner_groups_and_jsonl_keeps_flat_names(tmp_path):
    agent = corral.train("dqn", "CartPole-v1", steps=1500, run_dir=str(tmp_path / "run"), log_every=500,
                         learning_starts=200, **QUIET)
    tags = events(agent.run_dir).Tags()["scalars"]
    for tag in ("learner/q_loss", "learner/lr", "learner/updates", "train/episode_return", "train/steps_per_second"):
        assert tag in tags, tags
    rows = [json.loads(line) for line in (agent.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "q_loss" in rows[-1] and "updates" in rows[-1] and "lr" in rows[-1]
    updates = events(agent.run_dir).Scalars("learner/updates")
    assert updates[-1].value == agent._state["counters"]["updates"] > 0


def _assert_actor_and_learner_groups(run_dir: Path):
    tags = set(events(run_dir).Tags()["scalars"])
    for k in (0, 1):
        assert f"actor/{k}/steps_per_s" in tags, sorted(tags)
        assert f"actor/{k}/fragments" in tags
    assert {"learner/pg_loss", "learner/lr", "learner/updates", "scheme/policy_lag"} <= tags
    assert not any(t.startswith("collector") for t in tags)  # no flat names left in TensorBoard


def test_two_collectors_in_process_write_actor_and_learner_groups(tmp_path):
    from corral.schemes.fragments import FragmentScheme

    L = learner("ppo", "CartPole-v1", steps=4096, run_dir=tmp_path / "run", log_every=512,
                **{"scheme.collectors": 2, "env.num_envs": 2, "ppo.n_steps": 128, "ppo.batch_size": 128})
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    L.train()
    _assert_actor_and_learner_groups(L.run_dir)


def test_two_ray_collectors_write_actor_and_learner_groups(tmp_path):
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    agent = corral.train("ppo", "CartPole-v1", steps=2048, run_dir=str(tmp_path / "run"), log_every=512,
                         **{**QUIET, "scheme.collectors": 2, "env.num_envs": 2, "ppo.n_steps": 128,
                            "ppo.batch_size": 128})
    assert agent.summary["env_steps"] == 2048
    _assert_actor_and_learner_groups(agent.run_dir)
    episodes = events(agent.run_dir).Scalars("actor/0/episode_return")
    assert episodes and all(e.value > 0 for e in episodes)


def test_screenshots_of_terminal_states_are_tensorboard_images(tmp_path):
    agent = corral.train("ppo", "CartPole-v1", steps=2048, run_dir=str(tmp_path / "run"),
                         **{**QUIET, "log.screenshot_every": 3})
    ea = events(agent.run_dir)
    assert "screenshots/terminal" in ea.Tags()["images"]
    images = ea.Images("screenshots/terminal")
    # env 0 of 8 ends about 2048 / 8 / 22 episodes of random CartPole; every 3rd is shot
    assert len(images) >= 2
    assert images[0].width == 600 and images[0].height == 400  # CartPole's rgb_array frame
    assert images[0].encoded_image_string[:4] == b"\x89PNG"


def test_screenshots_need_an_env_that_renders_and_leave_no_run_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "ppo", "envs_for_tests:CountEnv", "--steps", "256", "--set", "log.screenshot_every=2"])
    assert rc == 2
    assert "render_mode=None" in capsys.readouterr().err
    rc = main(["train", "ppo", "CartPole-v1", "--steps", "256", "--set", "log.screenshot_every=2",
               "--set", "env.backend=subproc"])
    assert rc == 2
    assert "env.backend=sync" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_monitor_csv_per_env(tmp_path):
    agent = corral.train("ppo", "CartPole-v1", steps=2048, run_dir=str(tmp_path / "run"),
                         **{**QUIET, "log.monitor_csv": True, "env.num_envs": 4, "ppo.n_steps": 64,
                            "ppo.batch_size": 64})
    files = sorted((agent.run_dir / "monitor").glob("*.monitor.csv"))
    assert [f.name for f in files] == [f"{i}.monitor.csv" for i in range(4)]
    lines = files[0].read_text().splitlines()
    assert json.loads(lines[0][1:])["env_id"] == "CartPole-v1"
    rows = list(csv.DictReader(lines[1:]))
    assert rows and all(float(r["r"]) == int(r["l"]) for r in rows)  # CartPole: reward 1 per step
    total = sum(len(list(csv.DictReader(f.read_text().splitlines()[1:]))) for f in files)
    assert total == agent.summary["episodes"]


def test_tag_names_the_run_dir_and_is_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "CartPole-v1", "--steps", "512", "--tag", "lr-sweep.1", "--json",
                 "--set", "eval.episodes=0", "--set", "n_steps=64", "--set", "batch_size=64"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out.splitlines()[-1])["run_dir"])
    assert run_dir.name.startswith("ppo-CartPole-v1-lr-sweep.1-s0-")
    assert "tag: lr-sweep.1" in (tmp_path / run_dir / "config.yaml").read_text()
    assert "run/tag/text_summary" in events(tmp_path / run_dir).Tags()["tensors"]


@pytest.mark.parametrize("bad,message", [
    ("--tag=../evil", "log.tag: '../evil' is not allowed"),
    ("--set=log.screenshot_every=-1", "log.screenshot_every: -1 is out of range"),
    ("--set=log.monitor_csv=sometimes", "log.monitor_csv: expected bool"),
    ("--set=log.wandb_mode=ofline", "did you mean 'offline'"),
])
def test_bad_log_options_are_one_clear_error(bad, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "CartPole-v1", "--steps", "256", bad]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_mlflow_file_store_gets_the_same_metrics(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "mlruns").as_uri()
    agent = corral.train("ppo", "CartPole-v1", steps=1024, run_dir=str(tmp_path / "run"), tag="mlf",
                         **{**QUIET, "log.mlflow": True, "log.mlflow_uri": store, "log_every": 256,
                            "ppo.n_steps": 64, "ppo.batch_size": 64})
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("corral").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["corral.tag"] == "mlf"
    assert run.data.params["ppo.n_steps"] == "64"
    tb = {t: [(e.step, e.value) for e in events(agent.run_dir).Scalars(t)] for t in ("learner/pg_loss", "learner/updates")}
    for tag, points in tb.items():
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert [h[0] for h in hist] == [p[0] for p in points], tag
        assert [h[1] for h in hist] == pytest.approx([p[1] for p in points], rel=1e-6), tag


def test_wandb_offline_gets_the_same_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    agent = corral.train("ppo", "CartPole-v1", steps=1024, run_dir=str(tmp_path / "run"),
                         **{**QUIET, "log.wandb": True, "log_every": 256, "ppo.n_steps": 64, "ppo.batch_size": 64})
    import wandb

    wandb.teardown()  # the offline writer flushes when its service stops (at exit for the CLI)
    (offline,) = (agent.run_dir / "wandb").glob("offline-run-*")
    (log,) = offline.glob("run-*.wandb")  # the records `wandb sync` uploads later
    data = log.read_bytes()
    ea = events(agent.run_dir)
    tags = ea.Tags()["scalars"]
    assert "learner/pg_loss" in tags
    for tag in tags:  # every TensorBoard scalar is in the W&B history, under the same name
        assert tag.encode() in data, tag
    assert f"{ea.Scalars('learner/updates')[-1].value:.0f}".encode() in data


def test_missing_logger_package_is_a_user_error_before_the_run_dir(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def no_mlflow(name, *a, **k):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("no mlflow here")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(UserError, match=r"pip install 'corral\[mlflow\]'"):
        learner("ppo", "CartPole-v1", steps=256, **{"log.mlflow": True})
