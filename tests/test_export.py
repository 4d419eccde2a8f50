"""Export: the deterministic policy written as ONNX / TorchScript / ExportedProgram acts as
the PyTorch policy does (to 1e-5), normalizer and action scaling included; the CLI fails
loudly on bad input and on a broken export."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import corral
from corral.cli import main
from corral.export import (
    ExportError,
    input_specs,
    load_exported,
    original_obs_space,
    sample_observations,
)

TESTS_ENVS = "envs_for_tests"


def _train(algo, env, tmp_path=None, steps=256, **kw):
    return corral.train(algo, env, steps=steps, seed=0, save_run=tmp_path is not None,
                        run_dir=str(tmp_path / "run") if tmp_path is not None else None, **kw)


def _fresh_obs(agent, n=17, seed=123):
    """Observations the exporter's own check did not use (another seed, another batch size),
    as (inputs for the exported file, flat observations for Agent.act)."""
    from corral.export import _reference_flat

    space = original_obs_space(agent.cfg)
    specs, keys, sample_space = input_specs(agent.algo.obs_space, space)
    arrays = sample_observations(sample_space, keys, specs, n, seed=seed)
    return arrays, _reference_flat(sample_space, keys, arrays)


def _assert_parity(agent, path, fmt):
    arrays, flat = _fresh_obs(agent)
    got = load_exported(path, fmt)(*arrays)[0]
    want = agent.act(flat)
    assert got.shape == want.shape
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


CASES = {
    # (algo, env, overrides); a few hundred steps: the weights need not be good, only exported exactly
    "ppo_discrete_norm": ("ppo", "CartPole-v1", {"normalize_obs": True}),
    "ppo_continuous_norm": ("ppo", "Pendulum-v1", {"normalize_obs": True}),
    "sac": ("sac", "Pendulum-v1", {"learning_starts": 64, "batch_size": 32}),
    "dqn": ("dqn", "CartPole-v1", {"learning_starts": 64, "batch_size": 32}),
    "pixel": ("ppo", f"{TESTS_ENVS}:PixelTarget", {"n_steps": 32, "batch_size": 32}),
    "dict": ("ppo", f"{TESTS_ENVS}:PixelTargetDict", {"n_steps": 32, "batch_size": 32}),
}

_AGENTS: dict = {}


def _agent(name):
    if name not in _AGENTS:
        algo, env, kw = CASES[name]
        _AGENTS[name] = _train(algo, env, **kw)
    return _AGENTS[name]


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", list(CASES))
def test_exported_policy_acts_as_the_pytorch_policy(name, fmt, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    agent = _agent(name)
    out = agent.export(tmp_path / f"policy.{fmt}", format=fmt)
    assert out["max_abs_diff"] <= 1e-5
    _assert_parity(agent, out["path"], fmt)


def test_the_normalizer_is_inside_the_export(tmp_path):
    agent = _agent("ppo_continuous_norm")
    norm = agent.actor.obs_norm
    assert norm.enabled and float(norm.count) > 0 and float(norm.mean.abs().max()) > 0
    path = agent.export(tmp_path / "p.pt", format="torchscript")["path"]
    run = load_exported(path, "torchscript")
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    # resetting the live normalizer changes Agent.act, not the exported file
    before = run(obs)[0]
    with torch.no_grad():
        saved = (norm.mean.clone(), norm.var.clone())
        norm.mean.zero_()
        norm.var.fill_(1.0)
        norm._refresh()
        changed = agent.act(obs)
        norm.mean.copy_(saved[0])
        norm.var.copy_(saved[1])
        norm._refresh()
    assert not np.allclose(changed, before, atol=1e-5)
    np.testing.assert_allclose(run(obs)[0], agent.act(obs), atol=1e-5)


def test_continuous_actions_are_scaled_to_the_bounds(tmp_path):
    agent = _agent("ppo_continuous_norm")
    run = load_exported(agent.export(tmp_path / "p.pt", format="torchscript")["path"], "torchscript")
    obs = np.random.default_rng(1).normal(scale=50.0, size=(64, 3)).astype(np.float32)
    act = run(obs)[0]
    assert act.shape == (64, 1) and act.dtype == np.float32
    assert (act >= -2.0).all() and (act <= 2.0).all()  # Pendulum's torque bounds


def test_dict_observations_take_one_named_input_per_key(tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    agent = _agent("dict")
    out = agent.export(tmp_path / "p.onnx", format="onnx")
    assert [i[0] for i in out["inputs"]] == ["frame", "vec"]
    session = ort.InferenceSession(out["path"], providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("frame", "tensor(uint8)"), ("vec", "tensor(float)")]
    assert [o.name for o in session.get_outputs()] == ["action"]


@pytest.mark.parametrize("algo,env,kw", [
    ("td3", "Pendulum-v1", {"learning_starts": 64, "batch_size": 32}),
    ("c51", "CartPole-v1", {"learning_starts": 64, "batch_size": 32}),
    ("qrdqn", "CartPole-v1", {"learning_starts": 64, "batch_size": 32}),
    ("iqn", "CartPole-v1", {"learning_starts": 64, "batch_size": 32}),
    ("dqn", "FrozenLake-v1", {"learning_starts": 64, "batch_size": 32}),  # integer observations, one-hot inside
])
def test_other_families_export_exactly(algo, env, kw, tmp_path):
    agent = _train(algo, env, steps=160, **kw)
    for fmt in ("torchscript", "exported-program"):
        out = agent.export(tmp_path / f"p-{fmt}", format=fmt)
        _assert_parity(agent, out["path"], fmt)


def test_iqn_exports_its_fixed_midpoint_fractions(tmp_path):
    """IQN acts greedily on quantiles at the K midpoints (i + 0.5) / K: a deterministic
    policy, and what the export computes."""
    agent = _train("iqn", "CartPole-v1", steps=96, learning_starts=64, batch_size=32)
    net = agent.actor
    taus = net.acting_taus(3, "cpu")
    K = net.n_action_taus
    torch.testing.assert_close(taus[0], (torch.arange(K) + 0.5) / K * net.risk_eta)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(agent.act(obs), agent.act(obs))


# --- the CLI --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    _train("ppo", "CartPole-v1", base, steps=256, normalize_obs=True)
    return base / "run"


def test_cli_export_writes_a_checked_file(run_dir, capsys):
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    assert (run_dir / "policy.pt").is_file()
    assert "parity with the PyTorch policy" in capsys.readouterr().out
    agent = corral.load(run_dir)
    _assert_parity(agent, run_dir / "policy.pt", "torchscript")


def test_cli_export_exported_program_to_a_named_file(run_dir, tmp_path):
    out = tmp_path / "my-policy.pt2"
    assert main(["export", str(run_dir / "checkpoints" / "latest.pt"), "--format", "exported-program",
                 "--out", str(out)]) == 0
    _assert_parity(corral.load(run_dir), out, "exported-program")


def test_cli_rejects_a_bad_format(run_dir, capsys):
    assert main(["export", str(run_dir), "--format", "tflite"]) == 2
    err = capsys.readouterr().err
    assert "unknown export format 'tflite'" in err and "onnx, torchscript, exported-program" in err


def test_cli_rejects_a_missing_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--format", "onnx"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--format", "onnx"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err


def test_cli_rejects_an_out_path_in_a_missing_directory(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "no" / "p.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_broken_export_fails_the_parity_check(run_dir, tmp_path, monkeypatch, capsys):
    from corral import export as E

    forward = E.ExportModule.forward
    monkeypatch.setattr(E.ExportModule, "forward", lambda self, *x: forward(self, *x) + 1)  # every action off by one
    out = tmp_path / "broken.pt"
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "parity check failed" in err and "discrete values differ" in err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, no temp file left
    agent = corral.load(run_dir)
    with pytest.raises(ExportError, match="parity check failed"):
        agent.export(out, format="torchscript")


def test_a_small_float_error_fails_the_parity_check(tmp_path, monkeypatch):
    from corral import export as E

    agent = _agent("ppo_continuous_norm")
    forward = E.ExportModule.forward
    monkeypatch.setattr(E.ExportModule, "forward", lambda self, *x: forward(self, *x) + 1e-4)
    with pytest.raises(ExportError, match=r"max abs difference 0\.0001 > 1e-05"):
        agent.export(tmp_path / "p.pt", format="torchscript")


# --- more observation and action spaces, and the recurrent hook -------------------------------

class StartedDictEnv(__import__("gymnasium").Env):
    """Dict observations with integer parts that do not start at 0 (corral stores them less
    their start; the export takes the env's own values)."""

    def __init__(self):
        import gymnasium as gym

        self.observation_space = gym.spaces.Dict({
            "level": gym.spaces.Discrete(4, start=2),
            "grid": gym.spaces.MultiDiscrete([3, 2], start=[-1, 5]),
            "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action == 1), False, self.t >= 10, {}


@pytest.mark.parametrize("algo,env,kw", [
    ("dqn", "test_export:StartedDictEnv", {"learning_starts": 64, "batch_size": 32, "normalize_obs": True}),
    ("ppo", "test_dict_obs:MaskedEnv", {"n_steps": 32, "batch_size": 32, "normalize_obs": True}),  # action mask
    # an image part, SAC (a CNN in the actor and in the critics: a few gradient steps only)
    ("sac", "envs_for_tests:PixelTargetDict", {"learning_starts": 120, "batch_size": 8, "buffer_size": 1000}),
])
def test_dict_parts_with_starts_masks_and_images_export_exactly(algo, env, kw, tmp_path):
    agent = _train(algo, env, steps=128, **kw)
    for fmt in ("torchscript", "exported-program"):
        out = agent.export(tmp_path / f"p-{fmt}", format=fmt)
        _assert_parity(agent, out["path"], fmt)


def test_started_integer_parts_take_the_envs_own_values(tmp_path):
    agent = _train("dqn", "test_export:StartedDictEnv", steps=96, learning_starts=64, batch_size=32)
    out = agent.export(tmp_path / "p.pt", format="torchscript")
    assert [(n, d) for n, _, d in out["inputs"]] == [("grid", "int64"), ("level", "int64"), ("pos", "float32")]
    run = load_exported(out["path"], "torchscript")
    grid = np.array([[-1, 5], [1, 6]], np.int64)  # the env's values: [-1, 1] x [5, 6]
    level = np.array([2, 5], np.int64)
    pos = np.zeros((2, 2), np.float32)
    flat = np.array([[0, 0, 0, 0, 0], [2, 1, 3, 0, 0]], np.float32)  # what corral stores: less the starts
    np.testing.assert_array_equal(run(grid, level, pos)[0], agent.act(flat))


def test_multidiscrete_actions_export(tmp_path):
    import gymnasium as gym

    class MD(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        action_space = gym.spaces.MultiDiscrete([3, 4])

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, a):
            return self.observation_space.sample(), 0.0, False, True, {}

    agent = corral.train("ppo", MD, steps=64, save_run=False, n_steps=32, batch_size=32)
    out = agent.export(tmp_path / "p.pt", format="torchscript")
    obs = np.random.default_rng(0).uniform(-1, 1, (9, 3)).astype(np.float32)
    got = load_exported(out["path"], "torchscript")(obs)[0]
    assert got.shape == (9, 2)
    np.testing.assert_array_equal(got, agent.act(obs))


class _RecurrentPolicy(torch.nn.Module):
    """A toy policy with state, as an LSTM policy would hand it over through the hook."""

    from corral.actors.policy import StateSpec

    state_specs = (StateSpec("h", (5,)),)

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(obs_dim, 5)
        self.rec = torch.nn.Linear(5, 5)
        self.out = torch.nn.Linear(5, n_actions)

    def forward(self, obs, h):
        h = torch.tanh(self.inp(obs) + self.rec(h))
        return self.out(h).argmax(-1), h


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "exported-program"])
def test_a_policy_with_state_exports_through_the_hook(fmt, tmp_path, monkeypatch):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    agent = _agent("ppo_discrete_norm")
    policy = _RecurrentPolicy(4, 2)
    monkeypatch.setattr(type(agent.algo), "export_policy", lambda self: policy)
    out = agent.export(tmp_path / f"p.{fmt}", format=fmt)
    assert out["outputs"] == ["action", "h_out"]
    run = load_exported(out["path"], fmt)
    obs = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    h = np.zeros((6, 5), np.float32)
    for _ in range(3):  # the state carries over
        action, h_next = run(obs, h)
        with torch.no_grad():
            ref_a, ref_h = policy(torch.from_numpy(obs), torch.from_numpy(h))
        np.testing.assert_array_equal(action, ref_a.numpy())
        np.testing.assert_allclose(h_next, ref_h.numpy(), atol=1e-5, rtol=0)
        h = h_next


def test_a_wrong_next_state_fails_the_parity_check(tmp_path, monkeypatch):
    from corral import export as E

    agent = _agent("ppo_discrete_norm")
    monkeypatch.setattr(type(agent.algo), "export_policy", lambda self: _RecurrentPolicy(4, 2))
    forward = E.ExportModule.forward

    def broken(self, *x):
        a, h = forward(self, *x)
        return a, h * 1.001
    monkeypatch.setattr(E.ExportModule, "forward", broken)
    with pytest.raises(ExportError, match="parity check failed .*: h:"):
        agent.export(tmp_path / "p.pt", format="torchscript")


def test_a_recurrent_algorithm_is_refused_with_a_clear_message(tmp_path):
    agent = corral.train("ppo_lstm", "CartPole-v1", steps=64, save_run=False, n_steps=32, batch_size=32)
    from corral.errors import UserError

    with pytest.raises(UserError, match="recurrent policy.*not built yet"):
        agent.export(tmp_path / "p.pt", format="torchscript")
    assert not list(tmp_path.iterdir())
