"""PyBullet's envs through pybullet-envs-gymnasium (corral[pybullet]): the ids resolve without
``--import``, make envs with the right spaces, train briefly with TQC and PPO through the CLI,
keep PyBullet's C-level console messages out of stdout, and say which extra to install when
the package is missing. docs/tutorial.md's section 7 (PyTorchRL's PPO example on
HalfCheetahBulletEnv-v0) runs as written, for 3,000 steps. Skipped without the package, except
the missing-package message, which is simulated."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from corral.envs import make_factory, make_vec_env
from corral.envs.pybullet import KNOWN_IDS, QuietBullet, quiet_fds
from corral.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _installed() -> bool:
    try:
        return importlib.util.find_spec("pybullet_envs_gymnasium") is not None
    except ValueError:  # in sys.modules as None: hidden
        return False


needs_pybullet = pytest.mark.skipif(not _installed(), reason="pybullet-envs-gymnasium is not installed "
                                                             "(pip install 'corral[pybullet]')")

# id: (observation size, action size); the four locomotion envs with presets
LOCOMOTION = {
    "HalfCheetahBulletEnv-v0": (26, 6),
    "AntBulletEnv-v0": (28, 8),
    "HopperBulletEnv-v0": (15, 3),
    "Walker2DBulletEnv-v0": (22, 6),
}


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ and the tutorial's folders go here


@needs_pybullet
@pytest.mark.parametrize("env_id", sorted(LOCOMOTION))
def test_the_ids_make_envs_with_the_right_spaces(env_id):
    obs_dim, act_dim = LOCOMOTION[env_id]
    env = make_factory(env_id)()
    try:
        assert isinstance(env, QuietBullet)
        assert env.observation_space == gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        assert env.action_space == gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        assert env.spec.max_episode_steps == 1000  # truncated at 1000 steps, as rl-zoo's runs
        obs, _ = env.reset(seed=0)
        assert obs.shape == (obs_dim,) and obs.dtype == np.float32
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs.shape == (obs_dim,) and np.isfinite(reward)
    finally:
        env.close()
    venv = make_vec_env(env_id, 2)
    try:
        assert tuple(venv.reset(seed=0).shape) == (2, obs_dim)
    finally:
        venv.close()


@needs_pybullet
def test_a_typo_gets_the_bullet_ids_as_close_matches():
    with pytest.raises(UserError, match="did you mean HalfCheetahBulletEnv-v0"):
        make_factory("HalfCheetahBullet-v0")


@needs_pybullet
def test_every_known_id_is_registered_by_the_package():
    make_factory("HalfCheetahBulletEnv-v0")  # registers them
    assert set(KNOWN_IDS) <= set(gym.registry)


@needs_pybullet
@pytest.mark.parametrize("algo", ["tqc", "ppo"])
@pytest.mark.parametrize("env_id", sorted(LOCOMOTION))
def test_a_short_run_of_each_env_through_the_cli(algo, env_id, tmp_path, capfd):
    """A few hundred steps with the env's preset (networks and batch sizes as the full run's),
    then a one-episode evaluation; nothing from PyBullet's C library on stdout."""
    from corral.cli import main

    quick = {"tqc": ["--set", "tqc.learning_starts=100", "--set", "tqc.buffer_size=1000"],
             "ppo": ["--set", "env.num_envs=2", "--set", "ppo.n_steps=100", "--set", "ppo.n_epochs=1"]}[algo]
    rc = main(["train", algo, env_id, "--steps", "300", "--json", "--run-dir", str(tmp_path / "r"),
               "--set", "eval.episodes=1", "--set", "eval.max_episode_steps=200", "--set", "tensorboard=false",
               *quick])
    out, err = capfd.readouterr()
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # the JSON line and nothing else
    summary = json.loads(lines[0])
    assert summary["env_steps"] >= 300 and np.isfinite(summary["eval_return"])
    assert "argv[0]" not in out + err and "pybullet build time" not in out + err
    assert (tmp_path / "r" / "checkpoints" / "latest.pt").is_file()


# rl-zoo 2.9.2's Bullet entries (hyperparams/{tqc,sac,td3,ppo}.yml), one per algorithm as the files
# write them; the four envs differ only where BULLET_DIFFS says
BULLET_ZOO = {
    "tqc": dict(n_timesteps=1e6, policy="MlpPolicy", learning_rate=7.3e-4, buffer_size=300000, batch_size=256,
                ent_coef="auto", gamma=0.98, tau=0.02, train_freq=8, gradient_steps=8, learning_starts=10000,
                use_sde=True, policy_kwargs="dict(log_std_init=-3, net_arch=[400, 300], use_expln=True)"),
    "sac": dict(n_timesteps=1e6, policy="MlpPolicy", learning_rate=7.3e-4, buffer_size=300000, batch_size=256,
                ent_coef="auto", gamma=0.98, tau=0.02, train_freq=8, gradient_steps=8, learning_starts=10000,
                use_sde=True, policy_kwargs="dict(log_std_init=-3, net_arch=[400, 300], use_expln=True)"),
    "td3": dict(n_timesteps=1e6, policy="MlpPolicy", gamma=0.98, buffer_size=200000, learning_starts=10000,
                noise_type="normal", noise_std=0.1, gradient_steps=1, train_freq=1, batch_size=256,
                learning_rate=7e-4, policy_kwargs="dict(net_arch=[400, 300])"),
    "ppo": dict(normalize=True, n_envs=16, n_timesteps=2e6, policy="MlpPolicy", batch_size=128, n_steps=512,
                gamma=0.99, gae_lambda=0.9, n_epochs=20, ent_coef=0.0, sde_sample_freq=4, max_grad_norm=0.5,
                vf_coef=0.5, learning_rate=3e-5, use_sde=True, clip_range=0.4,
                policy_kwargs="dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, "
                              "net_arch=dict(pi=[256, 256], vf=[256, 256]) )"),
}
BULLET_DIFFS = {
    ("tqc", "HopperBulletEnv-v0"): dict(learning_rate="lin_7.3e-4", top_quantiles_to_drop_per_net=5),
    ("tqc", "Walker2DBulletEnv-v0"): dict(learning_rate="lin_7.3e-4"),
    ("sac", "HopperBulletEnv-v0"): dict(learning_rate="lin_7.3e-4"),
    ("sac", "Walker2DBulletEnv-v0"): dict(learning_rate="lin_7.3e-4"),
    ("ppo", "AntBulletEnv-v0"): dict(policy_kwargs="dict(log_std_init=-1, ortho_init=False, activation_fn=nn.ReLU, "
                                                   "net_arch=dict(pi=[256, 256], vf=[256, 256]) )"),
    ("ppo", "HopperBulletEnv-v0"): dict(clip_range="lin_0.4"),
    ("ppo", "Walker2DBulletEnv-v0"): dict(clip_range="lin_0.4"),
}


@needs_pybullet
@pytest.mark.parametrize("algo", sorted(BULLET_ZOO))
def test_the_presets_are_rl_zoos_entries_value_for_value(algo, tmp_path):
    """Each locomotion preset is the config `--config` makes of rl-zoo 2.9.2's entry for the env:
    every option equal, gSDE, schedules and initialisation included."""
    import dataclasses

    import yaml

    from corral.train.setup import build_config

    path = tmp_path / f"{algo}.yml"
    path.write_text(yaml.safe_dump({env: {**BULLET_ZOO[algo], **BULLET_DIFFS.get((algo, env), {})}
                                    for env in LOCOMOTION}))
    for env_id in sorted(LOCOMOTION):
        preset = dataclasses.asdict(build_config(algo, env_id))
        zoo = dataclasses.asdict(build_config(algo, env_id, config_file=str(path), use_preset=False))
        assert preset == zoo, (env_id, {k: (preset[k], zoo[k]) for k in preset if preset[k] != zoo[k]})


@needs_pybullet
def test_a_json_run_prints_only_its_json_line_on_stdout(tmp_path):
    """The console script in a fresh process, where PyBullet is first imported and its envs
    first connect: stdout holds the JSON summary alone (a pipeline's ``| jq`` parses it), and
    the C library's messages are on neither stream."""
    proc = subprocess.run(
        [sys.executable, "-m", "corral.cli", "train", "tqc", "HalfCheetahBulletEnv-v0", "--steps", "200", "--json",
         "--set", "tqc.learning_starts=100", "--set", "tqc.buffer_size=1000", "--set", "eval.episodes=1",
         "--set", "eval.max_episode_steps=100", "--set", "tensorboard=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("}\n"), proc.stdout
    assert json.loads(proc.stdout)["env_steps"] >= 200
    assert "argv[0]" not in proc.stdout + proc.stderr
    assert "pybullet build time" not in proc.stdout + proc.stderr


@needs_pybullet
def test_an_unwrapped_env_does_print_on_connect_so_the_check_above_means_something(tmp_path):
    code = ("import sys, gymnasium as gym, pybullet_envs_gymnasium\n"
            "env = gym.make('HalfCheetahBulletEnv-v0'); env.reset(seed=0); env.close()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "argv[0]" in proc.stdout


def test_quiet_fds_silences_c_level_writes_and_restores_the_descriptor(capfd):
    print("before", flush=True)
    with quiet_fds(1):
        os.write(1, b"from the C level\n")  # what the C library's printf does, below sys.stdout
    os.write(1, b"after\n")
    out = capfd.readouterr().out
    assert out == "before\nafter\n"


def test_quiet_fds_restores_the_descriptor_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError), quiet_fds(1):
        raise RuntimeError("boom")
    os.write(1, b"still here\n")
    assert capfd.readouterr().out == "still here\n"


def test_a_missing_package_names_the_extra(monkeypatch, capsys):
    """Simulated: the package hidden from imports and its ids unregistered."""
    monkeypatch.setitem(sys.modules, "pybullet_envs_gymnasium", None)  # import raises ImportError
    for env_id in KNOWN_IDS:
        if env_id in gym.registry:
            monkeypatch.delitem(gym.registry, env_id)
    with pytest.raises(UserError) as e:
        make_factory("HalfCheetahBulletEnv-v0")
    msg = str(e.value)
    assert "'HalfCheetahBulletEnv-v0' is a PyBullet env" in msg and "pip install 'corral[pybullet]'" in msg
    assert msg.count("\n") == 0  # one line

    from corral.cli import main

    assert main(["train", "tqc", "AntBulletEnv-v0", "--steps", "100"]) != 0
    err = capsys.readouterr().err
    assert "pip install 'corral[pybullet]'" in err and "Traceback" not in err


def _section_7_blocks() -> list[str]:
    page = (ROOT / "docs" / "tutorial.md").read_text()
    section = page[page.index("## 7. PyTorchRL's example"):]
    return re.findall(r"^```py\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)


@needs_pybullet
def test_the_tutorials_pytorchrl_example_runs_as_written(tmp_path, monkeypatch, capfd):
    """docs/tutorial.md section 7 as one script, its 1M steps cut to 3,000 (three PPO updates of
    1,000 steps) and its final evaluation to one 200-step episode: the only edits made."""
    blocks = _section_7_blocks()
    assert len(blocks) == 2
    full = "steps=1_000_000, run_dir="
    assert blocks[0].count(full) == 1
    blocks[0] = blocks[0].replace(full, 'steps=3_000, **{"eval.episodes": 1, "eval.max_episode_steps": 200, '
                                        '"tensorboard": False, "progress": False}, run_dir=')
    module = types.ModuleType("_corral_docs_tutorial_bullet")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"tutorial.md section 7 block {i + 1}", "exec"), module.__dict__)  # noqa: S102
        except Exception as e:
            raise AssertionError(f"tutorial.md section 7 block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e
    assert module.summary["env_steps"] == 3_000
    assert module.agent.cfg.env.id == "_corral_docs_tutorial_bullet:make_pybullet_train_env"
    assert module.agent.cfg.algo_cfg.n_steps == 1000 and module.agent.cfg.algo_cfg.batch_size == 250
    assert np.isfinite(module.episode_reward)
    assert (tmp_path / "train_example" / "run" / "checkpoints" / "latest.pt").is_file()
    assert (tmp_path / "train_example" / "monitor" / "0.monitor.csv").is_file()
    out = capfd.readouterr().out
    assert "argv[0]" not in out and "EPISODE: reward:" in out
