"""Run setup: the run's env, device, presets, config and run directory, from what a user names.

The Learner, collectors, evaluation and ``corral.load`` build their env through ``make_env``
(one place that applies the run's ``env`` section: backend, Atari wrappers, strict checks,
``on_error``)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from corral import config as C
from corral.algos import get_algo
from corral.envs import make_vec_env
from corral.envs.make import env_name, env_ref
from corral.errors import UserError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def make_env(cfg: C.TrainConfig, spec: Any = None, device: Any = "cpu", num_envs: int | None = None,
             evaluation: bool = False, max_episode_steps: int | None = None):
    """The run's vector env from its config (evaluation: no episodic life, no reward clipping,
    episodes cut at ``max_episode_steps``, default ``eval.max_episode_steps``)."""
    ec = cfg.env
    spec = spec if spec is not None else ec.id
    atari = ("eval" if evaluation else True) if ec.atari_wrappers else False
    cap = (max_episode_steps or cfg.eval.max_episode_steps) if evaluation else None
    multi_agent = True if get_algo(cfg.algo).cls.multi_agent else None  # else: as the env spec says
    return make_vec_env(spec, num_envs or ec.num_envs, env_kwargs(cfg, spec), device, ec.backend,
                        atari_wrappers=atari, strict=ec.strict, on_error=ec.on_error, max_episode_steps=cap,
                        mask_obs=ec.mask_obs, multi_agent=multi_agent, opponents=ec.opponents, pixels=ec.pixels,
                        wrappers=ec.wrappers)


def env_kwargs(cfg: C.TrainConfig, spec: Any = None) -> dict:
    """``env.kwargs`` with the options that become env arguments (``env.repeat_action_probability``)."""
    ec = cfg.env
    kwargs = dict(ec.kwargs)
    spec_ = spec if spec is not None else ec.id
    if cfg.log.screenshot_every > 0 and "render_mode" not in kwargs and isinstance(spec_, str) \
            and (spec_ in gym.registry or _is_atari(spec_)):
        kwargs["render_mode"] = "rgb_array"  # screenshots of terminal states (log.screenshot_every)
    sticky = ec.repeat_action_probability
    if sticky is not None:
        spec = spec if spec is not None else ec.id
        if not (isinstance(spec, str) and _is_atari(spec)):
            raise UserError(f"env.repeat_action_probability (sticky actions) is an Atari option; {env_name(spec)!r} "
                            "is not an ALE game: leave it unset")
        given = kwargs.get("repeat_action_probability")
        if given is not None and float(given) != sticky:
            raise UserError(f"env.repeat_action_probability={sticky:g} and env.kwargs.repeat_action_probability="
                            f"{given} disagree; set one of them")
        kwargs["repeat_action_probability"] = sticky
    return kwargs


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name!r} asked for CUDA but no GPU is visible; use --device cpu or auto")
    return dev


_HEAP_KEPT = False


def keep_heap() -> bool:
    """Keep freed memory in this process's heap (glibc only; process-wide, once).

    glibc hands allocations of 128 KiB and more to ``mmap`` and gives the top of the heap back
    to the OS whenever more than ~2x that is free, so a gradient step whose activations are a
    few hundred KiB each (SAC's twin critics at batch 256: ``[2, 256, 256]`` floats, 512 KiB)
    maps and faults in fresh pages for them every step: ~250-550 minor page faults and
    0.3-1.5 ms of system time a SAC step on this project's machine. Raising both thresholds
    (``mallopt``) lets the same memory be reused; values are unchanged (allocation only).
    Returns whether it applied (False off glibc)."""
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return True
    import ctypes
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    # mmap only from 32 MiB (glibc's largest threshold on 64-bit; replay storage is mapped as
    # before), and trim the heap top only when 256 MiB of it is free (a step frees a few MiB to
    # tens of MiB; a larger threshold would only keep more memory from the OS)
    _HEAP_KEPT = bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) & bool(libc.mallopt(M_TRIM_THRESHOLD, 256 << 20))
    return _HEAP_KEPT


def load_preset(algo: str, env_id: str, base: str | None = None) -> dict:
    """The preset for (algo, env): ``presets/<algo>.yaml`` keyed by the full env id; a
    ``native:`` id without a section of its own takes its Gymnasium twin's."""
    for name in (algo, base):
        if name is None:
            continue
        path = PRESET_DIR / f"{name}.yaml"
        if path.is_file():
            presets = C.load_yaml(str(path))
            key = env_id if env_id in presets else env_id.removeprefix("native:")
            if key not in presets and "atari" in presets and _is_atari(env_id):
                key = "atari"  # one section for every ALE game, as rl-zoo's
            if key in presets:
                data = dict(presets[key])
                if name != algo and base in data:  # a variant reuses its base algorithm's section
                    data[algo] = data.pop(base)
                return data
    return {}


def _is_atari(env_id: str) -> bool:
    """An ALE id or game name (``ALE/Pong-v5``, ``Pong``); False when ale-py is not installed."""
    from corral.envs.atari import is_ale_id, register_ale, resolve_short_name

    try:
        return register_ale() and (is_ale_id(env_id) or resolve_short_name(env_id) is not None)
    except UserError:
        return False


def list_presets() -> dict[str, list[str]]:
    return {p.stem: sorted(C.load_yaml(str(p))) for p in sorted(PRESET_DIR.glob("*.yaml"))}


def build_config(
    algo: str,
    env: Any,
    *,
    steps: int | None = None,
    seed: int | None = None,
    num_envs: int | None = None,
    device: str | None = None,
    config_file: str | None = None,
    sets: list[str] | tuple = (),
    overrides: dict | None = None,
    stop_at_return: float | None = None,
    use_preset: bool = True,
    tag: str | None = None,
    imports: list[str] | tuple = (),
    zoo: bool = False,
    lenient: bool = False,
) -> C.TrainConfig:
    """Defaults < algorithm variant < preset < config file < explicit arguments < --set.
    ``imports``: user modules imported first (an algorithm they register can be ``algo``).

    A config file in rl-zoo's layout (one entry per env id), or ``zoo=True`` (rl_zoo3's bundled
    ``hyperparams/<algo>.yml``), gives the entry for ``env`` in place of the preset, on top of
    Stable-Baselines3's defaults (corral/zoo/); its ``n_timesteps`` is the budget unless
    ``steps`` is given. ``lenient``: keys corral cannot honour are reported and skipped
    instead of refused."""
    from corral import zoo as Z

    import_user_modules(imports)
    spec = get_algo(algo)
    cfg = C.TrainConfig(algo=algo, algo_cfg=spec.cls.Config(), imports=tuple(imports))
    if spec.overrides:
        C.update_from_dict(cfg.algo_cfg, spec.overrides, algo + ".")
    env_id = env if isinstance(env, str) else env_ref(env)
    cfg.env.id = env_id
    if zoo and config_file:
        raise UserError("give either --zoo (rl_zoo3's bundled files) or --config FILE, not both")
    data = None
    if config_file:
        data = C.load_yaml(config_file)
    zoo_source = str(Z.bundled_file(algo)) if zoo else (config_file if Z.is_zoo_layout(data) else None)
    if zoo_source is not None:  # the entry replaces the preset
        zoo_data = C.load_yaml(zoo_source) if zoo else data
        t = Z.translate(algo, zoo_data, env_id, is_atari=_is_atari(env_id), source=zoo_source, algo_cfg=cfg.algo_cfg)
        Z.apply(cfg, t, lenient=lenient)
        cfg.env.id = env_id
    else:
        if use_preset:
            C.apply_dict(cfg, load_preset(algo, env_id, base=spec.cls.name))
        if config_file:
            if data.get("algo", algo) != algo:
                raise UserError(f"config file {config_file!r} is for algorithm {data['algo']!r}, not {algo!r}")
            C.apply_dict(cfg, data)
            cfg.env.id = env_id
    for name, value in (("steps", steps), ("seed", seed), ("device", device), ("stop_at_return", stop_at_return),
                        ("log.tag", tag)):
        if value is not None:
            C.apply_set(cfg, [(name, value)])
    if num_envs is not None:
        C.apply_set(cfg, [("env.num_envs", num_envs)])
    if overrides:
        C.apply_set(cfg, list(overrides.items()))
    C.apply_set(cfg, C.parse_set(list(sets)))
    return cfg


def config_from_dict(data: dict) -> C.TrainConfig:
    """A run's typed config from its saved mapping (``config.yaml``, a checkpoint's ``config``)."""
    import_user_modules(data.get("imports") or ())  # the run's own algorithms and envs
    spec = get_algo(data["algo"])
    cfg = C.TrainConfig(algo=data["algo"], algo_cfg=spec.cls.Config())
    C.apply_dict(cfg, data)
    return cfg


def import_user_modules(modules) -> None:
    """Import a run's ``imports`` (module names, or ``path/to/file.py``) so what they register
    (algorithms, envs) exists here; collectors and ``corral.load`` call it too."""
    import importlib
    import importlib.util
    import os
    import sys

    for name in modules or ():
        if name.endswith(".py"):
            path = os.path.abspath(name)
            mod_name = "_corral_user_" + os.path.splitext(os.path.basename(path))[0]
            if mod_name in sys.modules:
                continue
            if not os.path.exists(path):
                raise UserError(f"imports: file {name!r} does not exist")
            spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise UserError(f"imports: cannot import {name!r} ({e}); put it on PYTHONPATH or give a path/to/file.py") \
                from None


def new_run_dir(cfg: C.TrainConfig, run_dir: str | None, root: str = "runs") -> Path:
    """Create the run directory; never reuse an existing one."""
    if run_dir is None:
        safe_env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.id)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        tag = f"-{cfg.log.tag}" if cfg.log.tag else ""  # checked where it was set: safe in a file name
        path = Path(root) / f"{cfg.algo}-{safe_env}{tag}-s{cfg.seed}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(root) / f"{cfg.algo}-{safe_env}{tag}-s{cfg.seed}-{stamp}-{n}"
    else:
        path = Path(run_dir)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UserError(
                f"run directory {str(path)!r} already exists; continue it with `corral resume {path}` "
                "or choose another --run-dir"
            )
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    return path
