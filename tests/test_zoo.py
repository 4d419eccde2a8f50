"""rl-zoo's hyperparameter files as a config source (corral/zoo/, `--config FILE.yml`, `--zoo`).

The entries below are rl-zoo 2.9.2's own (hyperparams/ppo.yml, dqn.yml, sac.yml, td3.yml),
written here so these tests run without rl_zoo3; only the last tests need the package."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from corral import zoo as Z
from corral.cli import main
from corral.errors import UserError
from corral.train.setup import build_config

ROOT = Path(__file__).resolve().parent.parent
HAVE_ZOO = importlib.util.find_spec("rl_zoo3") is not None

PPO_YML = """
default:
  n_timesteps: !!float 1e6
  policy: 'MlpPolicy'

atari:
  env_wrapper:
    - stable_baselines3.common.atari_wrappers.AtariWrapper
  frame_stack: 4
  policy: 'CnnPolicy'
  n_envs: 8
  n_steps: 128
  n_epochs: 4
  batch_size: 256
  n_timesteps: !!float 1e7
  learning_rate: lin_2.5e-4
  clip_range: lin_0.1
  vf_coef: 0.5
  ent_coef: 0.01

Pendulum-v1:
  n_envs: 4
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  n_steps: 1024
  gae_lambda: 0.95
  gamma: 0.9
  n_epochs: 10
  ent_coef: 0.0
  learning_rate: !!float 1e-3
  clip_range: 0.2
  use_sde: True
  sde_sample_freq: 4

CartPole-v1:
  n_envs: 8
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  n_steps: 32
  batch_size: 256
  gae_lambda: 0.8
  gamma: 0.98
  n_epochs: 20
  ent_coef: 0.0
  learning_rate: lin_0.001
  clip_range: lin_0.2

MountainCar-v0:
  normalize: true
  n_envs: 16
  n_timesteps: !!float 1e6
  policy: 'MlpPolicy'
  n_steps: 16
  gae_lambda: 0.98
  gamma: 0.99
  n_epochs: 4
  ent_coef: 0.0

Acrobot-v1:
  normalize: "dict(norm_obs=True, norm_reward=False)"
  n_envs: 16
  n_timesteps: !!float 1e6
  policy: 'MlpPolicy'
  n_steps: 256
  gae_lambda: 0.94
  gamma: 0.99
  n_epochs: 4
  ent_coef: 0.0
  policy_kwargs: "dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=nn.ReLU)"
"""

DQN_YML = """
CartPole-v1:
  n_timesteps: !!float 5e4
  policy: 'MlpPolicy'
  learning_rate: !!float 2.3e-3
  batch_size: 64
  buffer_size: 100000
  learning_starts: 1000
  gamma: 0.99
  target_update_interval: 10
  train_freq: 256
  gradient_steps: 128
  exploration_fraction: 0.16
  exploration_final_eps: 0.04
  policy_kwargs: "dict(net_arch=[256, 256])"
"""

SAC_YML = """
Pendulum-v1:
  n_timesteps: 20000
  policy: 'MlpPolicy'
  learning_rate: !!float 1e-3
"""

TD3_YML = """
Pendulum-v1:
  n_timesteps: 20000
  policy: 'MlpPolicy'
  gamma: 0.98
  buffer_size: 200000
  learning_starts: 10000
  noise_type: 'normal'
  noise_std: 0.1
  gradient_steps: 1
  train_freq: 1
  learning_rate: !!float 1e-3
  policy_kwargs: "dict(net_arch=[400, 300])"
"""


@pytest.fixture
def zoo_file(tmp_path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


# --- the layout


def test_the_layout_is_detected_and_corrals_own_files_are_not():
    assert Z.is_zoo_layout(yaml.safe_load(PPO_YML))
    assert Z.is_zoo_layout(yaml.safe_load(SAC_YML))
    assert not Z.is_zoo_layout({"steps": 1000, "ppo": {"lr": 1e-3}})
    assert not Z.is_zoo_layout({"ppo": {"lr": 1e-3}, "env": {"num_envs": 4}})
    assert not Z.is_zoo_layout({})


def test_the_entry_is_the_envs_own_else_atari_for_ale_games_else_default():
    data = yaml.safe_load(PPO_YML)
    assert Z.select_entry(data, "CartPole-v1", is_atari=False)[0] == "CartPole-v1"
    assert Z.select_entry(data, "native:CartPole-v1", is_atari=False)[0] == "CartPole-v1"
    assert Z.select_entry(data, "ALE/Pong-v5", is_atari=True)[0] == "atari"
    assert Z.select_entry(data, "LunarLander-v3", is_atari=False)[0] == "default"
    with pytest.raises(UserError, match="no entry for 'LunarLander-v3'.*CartPole-v1"):
        Z.select_entry(yaml.safe_load(DQN_YML), "LunarLander-v3", is_atari=False)


# --- each mapped key on known entries


def test_ppo_cartpole_entry_maps_every_key(zoo_file):
    cfg = build_config("ppo", "CartPole-v1", config_file=zoo_file("ppo.yml", PPO_YML))
    a = cfg.algo_cfg
    assert cfg.env.num_envs == 8 and cfg.steps == 100_000 and cfg.env.id == "CartPole-v1"
    assert (a.n_steps, a.batch_size, a.gae_lambda, a.gamma, a.n_epochs, a.ent_coef) == (32, 256, 0.8, 0.98, 20, 0.0)
    assert a.lr == pytest.approx(1e-3) and a.lr_schedule == "linear"
    assert a.clip_range == pytest.approx(0.2) and a.clip_schedule == "linear"


def test_an_entry_replaces_the_preset_on_top_of_sb3s_defaults(zoo_file):
    # ppo's default entry names no n_steps: SB3's 2048, not corral's preset or default
    cfg = build_config("ppo", "LunarLander-v3", config_file=zoo_file("ppo.yml", PPO_YML))
    assert cfg.algo_cfg.n_steps == 2048 and cfg.steps == 1_000_000
    assert cfg.algo_cfg.lr_schedule == "constant"


def test_normalize_and_policy_kwargs(zoo_file):
    path = zoo_file("ppo.yml", PPO_YML)
    cfg = build_config("ppo", "MountainCar-v0", config_file=path)
    assert cfg.algo_cfg.normalize_obs and cfg.algo_cfg.normalize_reward
    cfg = build_config("ppo", "Acrobot-v1", config_file=path)
    assert cfg.algo_cfg.normalize_obs and not cfg.algo_cfg.normalize_reward
    assert cfg.algo_cfg.hidden == (64, 64) and cfg.algo_cfg.activation == "relu"


def test_dqn_cartpole_entry(zoo_file):
    cfg = build_config("dqn", "CartPole-v1", config_file=zoo_file("dqn.yml", DQN_YML))
    a = cfg.algo_cfg
    assert cfg.steps == 50_000 and cfg.env.num_envs == 1
    assert a.lr == pytest.approx(2.3e-3) and a.batch_size == 64 and a.buffer_size == 100_000
    assert (a.learning_starts, a.target_update_interval, a.train_freq, a.gradient_steps) == (1000, 10, 256, 128)
    assert a.exploration_fraction == pytest.approx(0.16) and a.exploration_final_eps == pytest.approx(0.04)
    assert a.hidden == (256, 256)


def test_sac_pendulum_entry_and_sb3_defaults(zoo_file):
    cfg = build_config("sac", "Pendulum-v1", config_file=zoo_file("sac.yml", SAC_YML))
    assert cfg.steps == 20_000 and cfg.algo_cfg.lr == pytest.approx(1e-3)
    assert cfg.algo_cfg.ent_coef is None and cfg.algo_cfg.hidden == (256, 256)


def test_td3_noise_and_net_arch(zoo_file):
    cfg = build_config("td3", "Pendulum-v1", config_file=zoo_file("td3.yml", TD3_YML))
    a = cfg.algo_cfg
    assert a.exploration_noise == pytest.approx(0.1) and a.hidden == (400, 300) and a.gamma == pytest.approx(0.98)
    assert a.learning_starts == 10_000 and a.buffer_size == 200_000
    # without noise_type SB3 adds no action noise
    no_noise = TD3_YML.replace("  noise_type: 'normal'\n  noise_std: 0.1\n", "")
    assert build_config("td3", "Pendulum-v1", config_file=zoo_file("td3b.yml", no_noise)).algo_cfg.exploration_noise == 0


def test_atari_entry_on_an_ale_game(zoo_file):
    pytest.importorskip("ale_py")
    cfg = build_config("ppo", "ALE/Pong-v5", config_file=zoo_file("ppo.yml", PPO_YML))
    assert cfg.env.atari_wrappers and cfg.env.num_envs == 8 and cfg.steps == 10_000_000
    assert cfg.algo_cfg.lr_schedule == "linear" and cfg.algo_cfg.clip_range == pytest.approx(0.1)
    bad = PPO_YML.replace("frame_stack: 4", "frame_stack: 2")
    with pytest.raises(UserError, match="'frame_stack'"):
        build_config("ppo", "ALE/Pong-v5", config_file=zoo_file("ppo2.yml", bad))


@pytest.mark.parametrize("key, value, field, expected", [
    ("ent_coef", "auto_0.1", "ent_coef_init", 0.1),
    ("target_entropy", "auto", "target_entropy", None),
    ("train_freq", [4, "step"], "train_freq", 4),
    ("tau", 0.02, "tau", 0.02),
    ("gradient_steps", -1, "gradient_steps", -1),
    ("policy_kwargs", "dict(n_critics=3, activation_fn=th.nn.Tanh)", "n_critics", 3),
])
def test_single_keys_on_sac(key, value, field, expected):
    data = {"Pendulum-v1": {"n_timesteps": 1000, "policy": "MlpPolicy", key: value}}
    t = Z.translate("sac", data, "Pendulum-v1", is_atari=False)
    assert not t.refused
    cfg = build_config("sac", "Pendulum-v1")
    Z.apply(cfg, t)
    got = getattr(cfg.algo_cfg, field)
    assert got == (pytest.approx(expected) if isinstance(expected, float) else expected)


def test_crossq_net_arch_with_qf_sizes_and_ppo_lstm_cores():
    data = {"Pendulum-v1": {"n_timesteps": 1000, "policy": "MlpPolicy",
                            "policy_kwargs": "dict(net_arch=dict(pi=[256, 256], qf=[2048, 2048]))"}}
    pairs = dict(Z.translate("crossq", data, "Pendulum-v1", is_atari=False).pairs)
    assert pairs["crossq.hidden"] == [256, 256] and pairs["crossq.critic_hidden"] == [2048, 2048]
    data = {"CartPoleNoVel-v1": {"n_timesteps": 1000, "policy": "MlpLstmPolicy",
                                 "policy_kwargs": "dict(lstm_hidden_size=32, enable_critic_lstm=True, "
                                                  "net_arch=dict(pi=[64], vf=[64]))"}}
    t = Z.translate("ppo_lstm", data, "CartPoleNoVel-v1", is_atari=False)
    pairs = dict(t.pairs)
    assert not t.refused and pairs["ppo_lstm.core_size"] == 32 and pairs["ppo_lstm.shared_core"] is False


def test_env_wrapper_becomes_env_wrappers_and_wraps_every_env_the_run_makes(zoo_file):
    import torch

    from corral.train.setup import make_env

    text = """
CartPole-v1:
  n_timesteps: 1000
  policy: 'MlpPolicy'
  env_wrapper:
    - gymnasium.wrappers.TimeLimit:
        max_episode_steps: 7
"""
    cfg = build_config("ppo", "CartPole-v1", config_file=zoo_file("ppo.yml", text))
    assert cfg.env.wrappers == [{"gymnasium.wrappers.TimeLimit": {"max_episode_steps": 7}}]
    for evaluation in (False, True):  # training and evaluation envs alike, as rl-zoo wraps both
        env = make_env(cfg, num_envs=2, evaluation=evaluation)
        env.reset(seed=0)
        lengths = []
        for _ in range(20):
            _, _, terminated, truncated, info = env.step(torch.zeros(2, dtype=torch.long))
            done = terminated | truncated
            lengths += info["episode_length"][done].tolist()
        env.close()
        assert lengths and max(lengths) <= 7 and 7 in lengths
    # a plain path, and one whose package is not installed (refused with the reason)
    data = {"MiniGrid-Empty-5x5-v0": {"n_timesteps": 10, "policy": "MlpPolicy",
                                      "env_wrapper": "minigrid.wrappers.FlatObsWrapper"}}
    pairs = dict(Z.translate("ppo", data, "MiniGrid-Empty-5x5-v0", is_atari=False).pairs)
    assert pairs["env.wrappers"] == ["minigrid.wrappers.FlatObsWrapper"]
    data = {"Pendulum-v1": {"n_timesteps": 10, "policy": "MlpPolicy",
                            "env_wrapper": [{"nosuchpackage.wrapper.AutoencoderWrapper": {"ae_path": "x"}}]}}
    refused = Z.translate("sac", data, "Pendulum-v1", is_atari=False).refused
    assert "'nosuchpackage' is not installed" in refused["env_wrapper"]


@pytest.mark.parametrize("wrappers, needle", [
    (["gymnasium.wrappers.NoSuchWrapper"], "has no 'NoSuchWrapper'"),
    (["nosuchpackage.Wrapper"], "cannot import 'nosuchpackage'"),
    ([{"gymnasium.wrappers.TimeLimit": {"max_steps": 3}}], r"TimeLimit\(max_steps=3\) failed"),
    ([3], "is not a wrapper"),
])
def test_env_wrappers_bad_input_is_one_message_naming_the_wrapper(wrappers, needle):
    from corral.train.setup import make_env

    cfg = build_config("ppo", "CartPole-v1", overrides={"env.wrappers": wrappers})
    with pytest.raises(UserError, match=needle):
        make_env(cfg, num_envs=1).close()


def test_memory_checks_see_an_address_space_limit():
    # the walk runs under `ulimit -v`: a replay past it (qrdqn's Atari entry, 1M frames) must be
    # refused by the replay's own check with its numbers, not crash in the allocator
    code = ("import resource; from corral.storage.replay_parts import available_memory as a; "
            "used = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:')); "
            "hard = resource.getrlimit(resource.RLIMIT_AS)[1]; "
            "resource.setrlimit(resource.RLIMIT_AS, (used + 2**30, hard)); print(a('cpu'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) <= 2**30


# --- schedules and the restricted parser


def test_schedule_parser():
    assert Z.parse_schedule("lin_0.001", "lr") == ("linear", 0.001)
    assert Z.parse_schedule("lin_2.5e-4", "lr") == ("linear", 2.5e-4)
    assert Z.parse_schedule(3e-4, "lr") == ("constant", 3e-4)
    assert Z.parse_schedule(1, "lr") == ("constant", 1.0)
    assert Z.parse_schedule("1e-3", "lr") == ("constant", 1e-3)
    for bad in ("exp_0.1", "lin_", "lin_x", True, None, [1]):
        with pytest.raises(UserError, match="lin_X"):
            Z.parse_schedule(bad, "lr")


def test_policy_kwargs_parser_reads_literals_and_whitelisted_names():
    got = Z.parse_literal("dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, "
                          "net_arch=dict(pi=[256, 256], vf=[256, 256]), )")
    assert got == {"log_std_init": -2, "ortho_init": False, "activation_fn": Z.Name("nn.ReLU"),
                   "net_arch": {"pi": [256, 256], "vf": [256, 256]}}
    assert Z.parse_literal("{'norm_obs': False, 'norm_reward': True}") == {"norm_obs": False, "norm_reward": True}
    assert Z.parse_literal("dict(a=th.nn.Tanh, b=torch.nn.ELU, c=None, d=(1, 2))") == {
        "a": Z.Name("nn.Tanh"), "b": Z.Name("nn.ELU"), "c": None, "d": [1, 2]}


@pytest.mark.parametrize("text, needle", [
    ("__import__('os')", "call __import__"),
    ("dict(a=__import__('os').system('true'))", "call __import__"),
    ("os.system", "name os.system"),
    ("nn.Module", "name nn.Module"),
    ("th.nn.ReLU.__class__", "name th.nn.ReLU.__class__"),
    ("dict(net_arch=list(range(3)))", "call list"),
    ("nn.ReLU()", "call nn.ReLU"),
    ("dict(**kw)", "'\\*\\*'"),
    ("[x for x in (1, 2)]", "expression"),
    ("1 + 2", "expression"),
    ("lambda: 0", "expression"),
    ("dict(a=open)", "name open"),
])
def test_policy_kwargs_parser_refuses_code(text, needle):
    with pytest.raises(UserError, match=needle):
        Z.parse_literal(text)


# --- refusals, --lenient, the budget


# crossq has no gSDE in corral (ppo, a2c, trpo, sac and tqc have it: tests/test_gsde.py, test_gsde_trpo.py)
CROSSQ_SDE_YML = """
Pendulum-v1:
  n_envs: 4
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  batch_size: 64
  use_sde: True
  sde_sample_freq: 4
"""


def test_a_key_corral_cannot_honour_is_refused_with_its_name_and_the_fix(zoo_file):
    with pytest.raises(UserError, match=r"'use_sde'.*gSDE.*--lenient") as e:
        build_config("crossq", "Pendulum-v1", config_file=zoo_file("crossq.yml", CROSSQ_SDE_YML))
    assert "'sde_sample_freq'" in str(e.value)
    data = {"CartPole-v1": {"n_timesteps": 10, "policy": "MlpPolicy", "callback": "x.Y", "frobnicate": 3,
                            "policy_kwargs": "dict(net_arch=[32], ortho_init=False, activation_fn=nn.GELU)"}}
    t = Z.translate("ppo", data, "CartPole-v1", is_atari=False)
    assert set(t.refused) == {"callback", "frobnicate", "policy_kwargs.activation_fn"}
    assert ("ppo.hidden", [32]) in t.pairs and ("ppo.init", "torch") in t.pairs  # the rest of policy_kwargs is taken
    bad = {"CartPole-v1": {"n_timesteps": 10, "policy": "MlpPolicy", "policy_kwargs": "__import__('os')"}}
    assert "not allowed" in Z.translate("ppo", bad, "CartPole-v1", is_atari=False).refused["policy_kwargs"]


def test_lenient_reports_each_skipped_key_on_stderr(zoo_file, capsys):
    cfg = build_config("crossq", "Pendulum-v1", config_file=zoo_file("crossq.yml", CROSSQ_SDE_YML), lenient=True)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "(--lenient)" in ln]
    assert len(lines) == 2 and "'use_sde'" in lines[0] and "'sde_sample_freq'" in lines[1]
    assert cfg.algo_cfg.batch_size == 64 and cfg.env.num_envs == 4


def test_n_timesteps_is_the_budget_unless_steps_is_given(zoo_file):
    path = zoo_file("ppo.yml", PPO_YML)
    assert build_config("ppo", "CartPole-v1", config_file=path).steps == 100_000
    assert build_config("ppo", "CartPole-v1", config_file=path, steps=5000).steps == 5000
    assert build_config("ppo", "CartPole-v1", config_file=path, sets=["ppo.n_epochs=3"]).algo_cfg.n_epochs == 3


def test_cli_refusal_is_one_message_and_exit_2(zoo_file, capsys, tmp_path):
    rc = main(["train", "crossq", "Pendulum-v1", "--config", zoo_file("crossq.yml", CROSSQ_SDE_YML), "--run-dir",
               str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("corral: error: ") and err.count("\n") == 1 and "use_sde" in err
    assert not (tmp_path / "run").exists()


def test_cli_trains_from_an_rl_zoo_file(zoo_file, capsys, tmp_path):
    rc = main(["train", "ppo", "CartPole-v1", "--config", zoo_file("ppo.yml", PPO_YML), "--steps", "512",
               "--run-dir", str(tmp_path / "run"), "--json", "--set", "eval.episodes=1", "--set", "progress=false",
               "--set", "tensorboard=false"])
    assert rc == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["steps"] == 512 and saved["ppo"]["n_steps"] == 32 and saved["ppo"]["lr_schedule"] == "linear"


def test_zoo_without_rl_zoo3_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rl_zoo3" else real(name, *a))
    assert main(["train", "ppo", "CartPole-v1", "--zoo"]) == 2
    assert "pip install 'corral[zoo]'" in capsys.readouterr().err


def test_docs_list_every_rl_zoo_key():
    text = (ROOT / "docs" / "config.md").read_text()
    section = text[text.index("## rl-zoo's hyperparameter files"):]
    missing = [k for k, _ in Z.describe_keys() if f"`{k}`" not in section]
    assert not missing, f"docs/config.md's rl-zoo table lacks {missing}"


# --- with rl_zoo3 installed


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
def test_zoo_reads_the_bundled_entry():
    cfg = build_config("ppo", "CartPole-v1", zoo=True)
    assert cfg.algo_cfg.n_steps == 32 and cfg.steps == 100_000 and cfg.algo_cfg.lr_schedule == "linear"
    with pytest.raises(UserError, match="either --zoo"):
        build_config("ppo", "CartPole-v1", zoo=True, config_file="x.yml")


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
def test_list_zoo_shows_ok_and_refused_entries(capsys):
    assert main(["list", "--zoo"]) == 0
    out = capsys.readouterr().out
    assert any(ln.split()[:3] == ["ppo", "CartPole-v1", "ok"] for ln in out.splitlines())
    assert any(ln.split()[:3] == ["ppo", "Pendulum-v1", "ok"] for ln in out.splitlines())  # gSDE
    assert any(ln.split()[:3] == ["trpo", "CartPole-v1", "ok"] for ln in out.splitlines())
    assert any(ln.split()[:3] == ["trpo", "Pendulum-v1", "ok"] for ln in out.splitlines())  # gSDE
    assert any(ln.split()[:3] == ["td3", "MountainCarContinuous-v0", "ok"] for ln in out.splitlines())  # OU noise
    assert any(ln.split()[:3] == ["crossq", "MountainCarContinuous-v0", "refused"] and "use_sde" in ln
               for ln in out.splitlines())
    assert any(ln.split()[:3] == ["ars", "CartPole-v1", "ok"] for ln in out.splitlines())


@pytest.mark.skipif(not HAVE_ZOO, reason="rl_zoo3 is not installed (pip install 'corral[zoo]')")
def test_zoo_entries_script_on_a_sample():
    # MiniGrid's entry names an env_wrapper (minigrid.wrappers.FlatObsWrapper: env.wrappers); her.yml's
    # algorithm is not one corral runs (its reason is listed)
    sample = "ppo/CartPole-v1,dqn/CartPole-v1,crossq/MountainCarContinuous-v0,ars/CartPole-v1,ppo/MiniGrid-Empty-Random-5x5-v0," \
             "her/FetchReach-v1"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zoo_entries.py"), "--steps", "300",
                           "--only", sample], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 entries: 4 ran, 1 refused, 0 failed; not run: 1 algorithm not in corral" in proc.stdout
    assert "use_sde" in proc.stdout and "her.yml is rl-zoo 1.x's layout" in proc.stdout
    ran = [ln.split()[0] for ln in proc.stdout.splitlines() if len(ln.split()) > 2 and "ran" in ln.split()[1:3]]
    assert "ppo/MiniGrid-Empty-Random-5x5-v0" in ran and "ars/CartPole-v1" in ran


def test_a_lin_x_learning_rate_on_a_replay_algorithm_is_its_linear_lr_schedule():
    data = {"Pendulum-v1": {"n_timesteps": 10, "policy": "MlpPolicy", "learning_rate": "lin_7.3e-4"}}
    for algo in ("sac", "td3", "tqc", "qrdqn"):
        t = Z.translate(algo, data, "Pendulum-v1", is_atari=False)
        assert not t.refused and (f"{algo}.lr", 7.3e-4) in t.pairs and (f"{algo}.lr_schedule", "linear") in t.pairs


# rl-zoo 2.9.2's BipedalWalkerHardcore-v3 entries (tqc.yml, sac.yml, td3.yml, ppo.yml)
HARDCORE = {
    "tqc": dict(n_timesteps=2e6, policy="MlpPolicy", learning_rate="lin_7.3e-4", buffer_size=1000000, batch_size=256,
                ent_coef="auto", gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1, learning_starts=10000,
                policy_kwargs="dict(net_arch=[400, 300])"),
    "sac": dict(n_timesteps=1e7, policy="MlpPolicy", learning_rate="lin_7.3e-4", buffer_size=1000000, batch_size=256,
                ent_coef=0.005, gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1, learning_starts=10000,
                policy_kwargs="dict(net_arch=[400, 300])"),
    "td3": dict(n_timesteps=1e7, policy="MlpPolicy", gamma=0.99, buffer_size=1000000, learning_starts=10000,
                noise_type="normal", noise_std=0.1, batch_size=256, train_freq=1, learning_rate="lin_7e-4",
                policy_kwargs="dict(net_arch=[400, 300])"),
    "ppo": dict(normalize=True, n_envs=16, n_timesteps=1e8, policy="MlpPolicy", n_steps=2048, batch_size=64,
                gae_lambda=0.95, gamma=0.99, n_epochs=10, ent_coef=0.001, learning_rate="lin_2.5e-4",
                clip_range="lin_0.2"),
}


@pytest.mark.parametrize("algo", sorted(HARDCORE))
def test_the_hardcore_presets_are_rl_zoos_entries_value_for_value(algo, tmp_path):
    """`corral train ALGO BipedalWalkerHardcore-v3` runs what `--config` makes of rl-zoo's entry:
    every option equal (schedules, fixed entropy coefficient, normalization, budget)."""
    import dataclasses

    env_id = "BipedalWalkerHardcore-v3"
    path = tmp_path / f"{algo}.yml"
    path.write_text(yaml.safe_dump({env_id: HARDCORE[algo]}))
    preset = dataclasses.asdict(build_config(algo, env_id))
    zoo = dataclasses.asdict(build_config(algo, env_id, config_file=str(path), use_preset=False))
    assert preset == zoo, {k: (preset[k], zoo[k]) for k in preset if preset[k] != zoo[k]}
