"""Export a trained policy to ONNX, TorchScript or a ``torch.export`` ExportedProgram.

What is exported is the **deterministic policy from raw observations to env actions**,
exactly what ``Agent.act(obs)`` computes: the observation normalizer (its statistics
frozen), one-hot encoding of integer observations, the CNN of pixel observations (uint8
in, scaled inside), and the action post-processing (a Box action clipped and scaled to the
env's bounds; argmax for discrete and value-based policies). Nothing outside the file is
needed to act.

Input convention (``docs/export.md``):

* a plain observation space: one input ``obs`` of shape ``[B, *obs_shape]`` in the space's
  dtype (float32 vectors, uint8 images, int64 for a Discrete observation);
* a ``Dict`` / ``Tuple`` observation space: one input per key, in the space's key order,
  named after the key (a Tuple's parts ``obs_0``, ``obs_1``, ...), each ``[B, *part_shape]``
  in the part's dtype; the graph concatenates them as corral's ``FlattenParts`` wrapper does;
* the output ``action``: ``[B, *act_shape]`` (int64 for Discrete / MultiDiscrete /
  MultiBinary actions, float32 for Box actions); the batch size ``B`` is dynamic.

Every export is checked: the saved file is loaded again (onnxruntime for ONNX) and run on a
batch of observations sampled from the observation space, and on one observation; its
actions must equal the PyTorch policy's within ``TOLERANCE`` (discrete actions exactly).
The file is written under a temporary name and moved into place only when the check
passes, so a failed export never leaves a wrong policy at the output path.

**Recurrent policies (the hook).** ``Algorithm.export_policy()`` returns the module to
export. A policy with state sets ``state_specs`` on that module: one
``StateSpec(name, shape, dtype)`` per state tensor (shape without the batch dim); its
``forward(*obs_inputs, *state)`` returns ``(action, *next_state)``. The exporter then adds
one input per state (named ``name``) and one output per next state (``name + "_out"``),
feeds zeros (an episode start) and then the returned state for a second step in the parity
check, and compares the states as well as the actions. Nothing else changes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from corral.actors.policy import DeterministicPolicy, StateSpec
from corral.errors import UserError

FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "exported-program": ".pt2"}
TOLERANCE = 1e-5
PARITY_BATCH = 64
ONNX_OPSET = 18


class ExportError(RuntimeError):
    """An export that failed its parity check (or could not be traced)."""


class InputSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]  # without the batch dim
    dtype: np.dtype


class PartsFlattener(nn.Module):
    """One tensor per Dict / Tuple key -> corral's flat observation vector (as
    ``corral.envs.spaces.FlattenParts.observation``: integer parts less their ``start``,
    everything reshaped to ``[B, -1]`` and cast to float32, in key order)."""

    def __init__(self, starts: list[np.ndarray | None]):
        super().__init__()
        self.n = len(starts)
        for i, s in enumerate(starts):
            self.register_buffer(f"start{i}", torch.as_tensor(np.reshape(s, -1) if s is not None else np.zeros(0),
                                                              dtype=torch.float32), persistent=False)
        self.has_start = [s is not None and bool(np.any(s)) for s in starts]

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        flat = []
        for i, p in enumerate(parts):
            x = p.reshape(p.shape[0], -1).to(torch.float32)
            if self.has_start[i]:
                x = x - getattr(self, f"start{i}")
            flat.append(x)
        return torch.cat(flat, dim=1)


class ExportModule(nn.Module):
    """What is written: the flattener of a Dict observation (if any), then the policy."""

    def __init__(self, policy: nn.Module, flattener: PartsFlattener | None, n_obs: int):
        super().__init__()
        self.policy = policy
        self.flattener = flattener
        self.n_obs = n_obs

    def forward(self, *inputs: torch.Tensor):
        obs, state = inputs[:self.n_obs], inputs[self.n_obs:]
        x = self.flattener(*obs) if self.flattener is not None else obs[0]
        return self.policy(x, *state)


# --- observation spaces -------------------------------------------------------------------

def original_obs_space(cfg) -> gym.Space | None:
    """The env's own observation space before corral flattened a Dict / Tuple (None if the
    env cannot be rebuilt from the run's config)."""
    from corral.envs.make import make_factory
    from corral.train.setup import env_kwargs

    try:
        env = make_factory(cfg.env.id, env_kwargs(cfg), atari_wrappers="eval")()
    except Exception:  # noqa: BLE001 - only the per-key input convention is lost
        return None
    try:
        return env.observation_space
    finally:
        env.close()


def _starts(space: gym.Space) -> np.ndarray | None:
    if isinstance(space, gym.spaces.Discrete):
        return np.array([int(space.start)])
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = getattr(space, "start", None)
        return np.reshape(start, -1).astype(np.int64) if start is not None else np.zeros(int(space.nvec.size), np.int64)
    return None


def _input_name(key: str, used: set[str]) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in str(key)) or "obs"
    if name[0].isdigit():
        name = "obs_" + name
    while name in used:
        name += "_"
    used.add(name)
    return name


def input_specs(flat_space: gym.Space, space: gym.Space | None) -> tuple[list[InputSpec], list[Any], gym.Space]:
    """(inputs, the part keys (None: one ``obs`` input), the space observations are sampled from)."""
    parted = isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
    if not parted:
        return [InputSpec("obs", tuple(flat_space.shape), np.dtype(flat_space.dtype))], [None], flat_space
    items = list(space.spaces.items()) if isinstance(space, gym.spaces.Dict) else list(enumerate(space.spaces))
    used: set[str] = set()
    specs = []
    for key, sub in items:
        if not isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            raise UserError(f"observation part {key!r} is a {type(sub).__name__}: export takes Dict / Tuple "
                            "observations of Box, Discrete, MultiDiscrete and MultiBinary parts (not nested spaces)")
        dtype = np.dtype(np.int64) if isinstance(sub, gym.spaces.Discrete) else np.dtype(sub.dtype)
        name = _input_name(key if isinstance(space, gym.spaces.Dict) else f"obs_{key}", used)
        specs.append(InputSpec(name, tuple(sub.shape or ()), dtype))
    return specs, [k for k, _ in items], space


def sample_observations(space: gym.Space, keys: list[Any], specs: list[InputSpec], n: int,
                        seed: int = 0) -> list[np.ndarray]:
    """``n`` observations drawn from ``space``, one stacked array per input. Unbounded Box
    dims are drawn from a standard normal by gymnasium; every value is finite."""
    space = copy.deepcopy(space)
    space.seed(seed)
    draws = [space.sample() for _ in range(n)]
    if keys == [None]:
        return [np.stack(draws).astype(specs[0].dtype, copy=False)]
    return [np.stack([np.asarray(d[k]) for d in draws]).astype(s.dtype, copy=False) for k, s in zip(keys, specs)]


def _reference_flat(space: gym.Space, keys: list[Any], arrays: list[np.ndarray]) -> np.ndarray:
    """Flat observations made by corral's own env wrapper (not the exported flattener), so
    the parity check also checks the flattening."""
    if keys == [None]:
        return arrays[0]
    from corral.envs.spaces import FlattenParts

    class _Shell(gym.Env):
        observation_space = space
        action_space = gym.spaces.Discrete(1)

    wrapper = FlattenParts(_Shell())
    rows = []
    for i in range(arrays[0].shape[0]):
        obs = {k: a[i] for k, a in zip(keys, arrays)} if isinstance(space, gym.spaces.Dict) else \
            tuple(a[i] for a in arrays)
        rows.append(wrapper.observation(obs))
    return np.stack(rows)


# --- writers and readers ------------------------------------------------------------------

def _write(module: nn.Module, example: tuple[torch.Tensor, ...], fmt: str, path: Path,
           input_names: list[str], output_names: list[str]) -> None:
    from corral.nets import plain_activations

    # the exporters' own chatter (tracer warnings about static branches, optional torchvision
    # ops) says nothing about this policy; the parity check is what tells
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), plain_activations(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            _write_format(module, example, fmt, path, input_names, output_names)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _write_format(module, example, fmt, path, input_names, output_names) -> None:
    if fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(module, example, check_trace=False)
        torch.jit.save(traced, str(path))
        return
    batch = torch.export.Dim("batch", min=1)
    dynamic = (tuple({0: batch} for _ in example),)  # forward(*inputs): one varargs entry
    if fmt == "exported-program":
        with torch.no_grad():
            program = torch.export.export(module, example, dynamic_shapes=dynamic)
        torch.export.save(program, str(path))
        return
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError("ONNX export needs onnx and onnxscript: pip install 'corral[export]'") from None
    with torch.no_grad():
        torch.onnx.export(module, example, str(path), input_names=input_names, output_names=output_names,
                          dynamic_shapes=dynamic, opset_version=ONNX_OPSET, dynamo=True, external_data=False,
                          verbose=False)


def load_exported(path: str | Path, fmt: str):
    """A callable ``(*numpy inputs) -> list of numpy outputs`` for an exported file."""
    path = str(path)
    if fmt == "onnx":
        try:
            import onnxruntime as ort
        except ImportError:
            raise UserError("checking an ONNX export needs onnxruntime: pip install 'corral[export]'") from None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run_onnx(*arrays):
            return session.run(None, dict(zip(names, arrays)))
        return run_onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.9+: TorchScript is deprecated, still loads
        module = torch.jit.load(path) if fmt == "torchscript" else torch.export.load(path).module()

    def run_torch(*arrays):
        with torch.no_grad():
            out = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.numpy() for o in out]
    return run_torch


# --- the export -----------------------------------------------------------------------------

def _compare(name: str, ref: np.ndarray, got: np.ndarray, tol: float) -> str | None:
    got = np.asarray(got)
    if got.shape != ref.shape:
        return f"{name}: shape {got.shape}, the PyTorch policy's is {ref.shape}"
    if np.issubdtype(ref.dtype, np.integer) or ref.dtype == np.bool_:
        bad = int((got != ref).sum())
        return f"{name}: {bad} of {ref.size} discrete values differ" if bad else None
    diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0
    return f"{name}: max abs difference {diff:.3g} > {tol:g}" if not diff <= tol else None


def parity_check(run, policy: nn.Module, inputs: list[np.ndarray], reference_obs: torch.Tensor,
                 state_specs: tuple[StateSpec, ...], tol: float = TOLERANCE) -> float:
    """Run the exported ``run`` and the PyTorch ``policy`` on the same observations (two
    steps with state for a recurrent policy); raise ``ExportError`` naming the first output
    that differs. Returns the largest float difference seen."""
    batch = reference_obs.shape[0]
    state_t = [torch.zeros(batch, *s.shape, dtype=s.dtype) for s in state_specs]
    worst = 0.0
    for step in range(2 if state_specs else 1):
        with torch.no_grad():
            ref = policy(reference_obs, *state_t)
        ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        got = run(*inputs, *(s.numpy() for s in state_t))
        names = ["action"] + [s.name for s in state_specs]
        if len(got) != len(ref):
            raise ExportError(f"the exported policy returns {len(got)} outputs, the PyTorch policy {len(ref)}")
        for name, r, g in zip(names, ref, got):
            r = r.cpu().numpy()
            problem = _compare(name if step == 0 else f"{name} (step {step + 1})", r, g, tol)
            if problem:
                raise ExportError(f"parity check failed on {batch} sample observations: {problem}")
            if np.issubdtype(r.dtype, np.floating) and r.size:
                worst = max(worst, float(np.max(np.abs(np.asarray(g, np.float64) - r))))
        state_t = [t.detach().cpu() for t in ref[1:]]
    return worst


def export_agent(agent, path: str | Path | None = None, format: str = "onnx", obs_space: gym.Space | None = None,
                 tolerance: float = TOLERANCE) -> dict:
    """Write ``agent``'s deterministic policy to ``path`` in ``format`` and check it.

    Returns ``{"path", "format", "inputs", "outputs", "max_abs_diff", "checked_batch"}``.
    ``obs_space``: the env's own (Dict / Tuple) observation space, when the run's env cannot
    be rebuilt from its config; by default it is rebuilt. Raises ``UserError`` for a bad
    format or path and ``ExportError`` when the parity check fails."""
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r}; use one of {', '.join(FORMATS)}")
    if path is None:
        base = agent.run_dir if agent.run_dir is not None else Path(".")
        path = Path(base) / f"policy{FORMATS[format]}"
    path = Path(path)
    if path.is_dir():
        raise UserError(f"export path {str(path)!r} is a directory; give a file name, "
                        f"e.g. {str(path / ('policy' + FORMATS[format]))!r}")
    if not path.parent.is_dir():
        raise UserError(f"the directory of {str(path)!r} does not exist; create it first")

    algo = agent.algo
    policy = copy.deepcopy(algo.export_policy()).cpu().eval()
    state_specs = tuple(getattr(policy, "state_specs", ()))
    flat_space = algo.obs_space
    from corral.envs.spaces import layout_of

    space = obs_space
    if space is None and layout_of(flat_space):
        space = original_obs_space(agent.cfg)
    specs, keys, sample_space = input_specs(flat_space, space)
    flattener = None
    if keys != [None]:
        flattener = PartsFlattener([_starts(sub) for sub in (space.spaces.values() if isinstance(space, gym.spaces.Dict)
                                                              else space.spaces)])
    module = ExportModule(policy, flattener, len(specs)).eval()
    names_in = [s.name for s in specs] + [s.name for s in state_specs]
    names_out = ["action"] + [s.name + "_out" for s in state_specs]

    arrays = sample_observations(sample_space, keys, specs, PARITY_BATCH, seed=agent.cfg.seed)
    flat = torch.as_tensor(_reference_flat(sample_space, keys, arrays))
    if flat.is_floating_point():
        flat = flat.float()
    example = tuple(torch.from_numpy(a[:2].copy()) for a in arrays) + \
        tuple(torch.zeros(2, *s.shape, dtype=s.dtype) for s in state_specs)

    # torch.export.load wants a name ending in .pt2: the temporary file has the format's suffix
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp.", suffix=FORMATS[format], dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        try:
            _write(module, example, format, tmp, names_in, names_out)
        except UserError:
            raise
        except Exception as e:  # tracing / exporter failures: one clear line
            raise ExportError(f"{format} export of {type(policy.actor if isinstance(policy, DeterministicPolicy) else policy).__name__} "
                              f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        run = load_exported(tmp, format)
        worst = parity_check(run, policy, arrays, flat, state_specs, tolerance)
        worst = max(worst, parity_check(run, policy, [a[:1] for a in arrays], flat[:1], state_specs, tolerance))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(path), "format": format,
            "inputs": [(s.name, ["B", *s.shape], str(s.dtype)) for s in (*specs, *state_specs)],
            "outputs": names_out, "max_abs_diff": worst, "checked_batch": PARITY_BATCH}
