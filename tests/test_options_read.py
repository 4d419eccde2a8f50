"""Every option of every algorithm is read by that algorithm (issue 36): an option that is
accepted but never read is silently ignored, the worst kind of config error.

The check follows the code an algorithm runs, not just the files it lives in: from the
methods the outside calls (those ``Algorithm`` declares, ``__init__``, and the gradient
workers' ``minibatch_loss`` / ``phases`` where the class declares ``grad_sharding``), it
follows ``self.x`` (resolved on the class, so an overridden method's parent version is not
reached), ``super().x`` (the next definition in the MRO), and the corral functions and
classes a reached body names. A field counts as read where a reached body reads ``.field`` or
``getattr(..., "field")``; reads outside ``corral/algos`` (the learner, the schemes) count
for every algorithm. IMPALA's ``gae_lambda`` is read in ``gae_batch``, which IMPALA's own
``prepare_batch`` never calls: that is what this test catches and a file-level scan does not.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

import corral.algos
from corral.algos import ALGOS
from corral.algos.a2c import A2C, A2CConfig
from corral.algos.apex import ApexDQN, ApexDQNConfig, ApexTD3, ApexTD3Config
from corral.algos.base import Algorithm
from corral.algos.impala import IMPALA, IMPALAConfig
from corral.algos.ppo import PPO, PPOConfig
from corral.config import option
from corral.errors import UserError
from corral.train.setup import build_config

ROOT = Path(corral.algos.__file__).resolve().parent.parent

# Fields read where this scan cannot see, with the reason. Only shrink this.
INDIRECT = {
    # read to refuse a set value, in a loop over the names: ``for key in (...): getattr(cfg, key)``
    "MAPPOConfig": {"normalize_obs"},
}


def _in_corral(obj) -> bool:
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
    except (TypeError, OSError):
        return False
    return ROOT in path.parents


@functools.lru_cache(maxsize=None)
def _tree(func) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None


def _functions(obj):
    """The plain functions behind a method, property, staticmethod or classmethod."""
    if isinstance(obj, property):
        return [f for f in (obj.fget, obj.fset) if f is not None]
    if isinstance(obj, (staticmethod, classmethod)):
        return [obj.__func__]
    if isinstance(obj, functools.cached_property):
        return [obj.func]
    if isinstance(obj, types.FunctionType):
        return [obj]
    return []


def _lookup(cls, name: str, after: type | None = None):
    """``(owner, raw attribute)`` of ``name`` on ``cls``'s MRO (after ``after`` for super())."""
    mro = cls.__mro__
    if after is not None and after in mro:
        mro = mro[mro.index(after) + 1:]
    for klass in mro:
        if name in vars(klass):
            return klass, vars(klass)[name]
    return None, None


def _owner(cls, func) -> type | None:
    for klass in cls.__mro__:
        if any(func in _functions(v) for v in vars(klass).values()):
            return klass
    return None


def reads_of(cls, seeds: set[str]) -> set[str]:
    """Attribute names read by the code ``cls`` runs from the methods ``seeds``."""
    todo = [f for name in seeds for f in _functions(_lookup(cls, name)[1])]
    seen, reads = set(), set()
    while todo:
        func = todo.pop()
        if func in seen or not _in_corral(func):
            continue
        seen.add(func)
        tree = _tree(func)
        if tree is None:
            continue
        owner = _owner(cls, func)
        glb = getattr(func, "__globals__", {})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add(node.attr)
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    todo += _functions(_lookup(cls, node.attr)[1])
                elif (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                      and base.func.id == "super"):
                    todo += _functions(_lookup(cls, node.attr, after=owner)[1])
                elif isinstance(base, ast.Name) and isinstance(glb.get(base.id), types.ModuleType):
                    todo += _callees(getattr(glb[base.id], node.attr, None))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                    name = node.args[1].value
                    reads.add(name)
                    if isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                        todo += _functions(_lookup(cls, name)[1])
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in glb:
                todo += _callees(glb[node.id])
    return reads


def _callees(obj) -> list:
    """A corral function, or every method of a corral class (not an algorithm: those are
    followed through ``self``)."""
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, type) and not issubclass(obj, Algorithm) and _in_corral(obj):
        return [f for klass in obj.__mro__ if _in_corral(klass) for v in vars(klass).values() for f in _functions(v)]
    return []


def entry_points(cls) -> set[str]:
    seeds = {n for n in vars(Algorithm) if not n.startswith("__")} | {"__init__"}
    if cls.grad_sharding is not None:  # the gradient workers' hooks (schemes/grad.py)
        seeds |= {"minibatch_loss", "phases"}
    return seeds


@functools.lru_cache(maxsize=None)
def outside_reads() -> frozenset[str]:
    """Attribute names read anywhere in corral outside ``corral/algos`` (learner, schemes, CLI)."""
    out = set()
    for path in ROOT.rglob("*.py"):
        if (ROOT / "algos") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                out.add(node.attr)
    return frozenset(out)


def unread_fields(cls) -> list[str]:
    """The fields of ``cls.Config`` that no code ``cls`` runs reads."""
    reads = reads_of(cls, entry_points(cls)) | outside_reads()
    for klass in cls.Config.__mro__:  # the config's own methods (checks in __post_init__, sizes)
        for v in vars(klass).values():
            for f in _functions(v):
                if _in_corral(f):
                    reads |= _body_reads(f)
    allowed = INDIRECT.get(cls.Config.__name__, set())
    return [f.name for f in fields(cls.Config) if f.name not in reads and f.name not in allowed]


def _body_reads(func) -> set[str]:
    tree = _tree(func)
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} if tree is not None else set()


def _classes_by_config() -> dict[type, list[type]]:
    """Each registry Config with every algorithm class built from it (variants included)."""
    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    configs = {spec.cls.Config for spec in ALGOS.values()}
    out: dict[type, list[type]] = {c: [] for c in configs}
    for klass in [Algorithm, *subclasses(Algorithm)]:
        if getattr(klass, "Config", None) in out and _in_corral(klass):
            out[klass.Config].append(klass)
    return out


CONFIGS = _classes_by_config()


@pytest.mark.parametrize("config", sorted(CONFIGS, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_option_is_read_by_its_algorithm(config):
    unread = set.intersection(*(set(unread_fields(cls)) for cls in CONFIGS[config]))
    assert not unread, (f"{config.__name__}: {sorted(unread)} accepted but never read by "
                        f"{', '.join(c.__name__ for c in CONFIGS[config])}; honour them or take them out of the "
                        "Config")


# --- the check fails on an unread option (each bug it was written for, put back on a copy)

@dataclass
class _UnreadKnobConfig(PPOConfig):
    unread_knob: float = option(1.0, "an option no code reads")


class _PPOWithUnreadKnob(PPO):
    Config = _UnreadKnobConfig


@dataclass
class _IMPALAWithGAEConfig(IMPALAConfig):  # IMPALA's options before the fix
    gae_lambda: float = option(0.95, "GAE lambda")
    clip_range_vf: float | None = option(None, "value clipping range")


class _IMPALAWithGAE(IMPALA):
    Config = _IMPALAWithGAEConfig


@dataclass
class _A2CWithPPOsOptionsConfig(A2CConfig):  # A2C as a PPO subclass had them, as fixed class attributes
    n_epochs: int = option(1, "passes over each rollout")
    clip_range: float = option(0.2, "surrogate clip range epsilon")


class _A2CWithPPOsOptions(A2C):
    Config = _A2CWithPPOsOptionsConfig


@dataclass
class _ApexDQNWithScheduleConfig(ApexDQNConfig):
    exploration_fraction: float = option(0.1, "fraction of the run over which epsilon decays")


class _ApexDQNWithSchedule(ApexDQN):
    Config = _ApexDQNWithScheduleConfig


@dataclass
class _ApexTD3WithNoiseConfig(ApexTD3Config):
    exploration_noise: float = option(0.1, "std of the Gaussian exploration noise")


class _ApexTD3WithNoise(ApexTD3):
    Config = _ApexTD3WithNoiseConfig


@pytest.mark.parametrize("cls, unread", [
    (_PPOWithUnreadKnob, ["unread_knob"]),
    (_IMPALAWithGAE, ["gae_lambda", "clip_range_vf"]),  # read in gae_batch / ppo_loss, not on IMPALA's path
    (_A2CWithPPOsOptions, ["n_epochs", "clip_range"]),  # PPO's batcher and loss, not A2C's parts
    (_ApexDQNWithSchedule, ["exploration_fraction"]),  # read by DQN.epsilon, which ApexDQN overrides
    (_ApexTD3WithNoise, ["exploration_noise"]),  # read by TD3.explore, which ApexTD3 overrides
])
def test_the_check_names_an_option_nothing_reads(cls, unread):
    assert sorted(unread_fields(cls)) == sorted(unread)


@pytest.mark.parametrize("algo, env, key", [
    ("impala", "CartPole-v1", "gae_lambda"),
    ("appo", "CartPole-v1", "clip_range_vf"),
    ("impala_lstm", "CartPole-v1", "gae_lambda"),
    ("a2c", "CartPole-v1", "clip_range"),  # the on-policy members take only their own parts' options
    ("a2c", "CartPole-v1", "n_epochs"),
    ("a2c", "CartPole-v1", "target_kl"),
    ("reinforce", "CartPole-v1", "n_epochs"),
    ("reinforce", "CartPole-v1", "gae_lambda"),
    ("reinforce", "CartPole-v1", "normalize_reward"),
    ("trpo", "Pendulum-v1", "clip_range"),
    ("trpo", "Pendulum-v1", "ent_coef"),
    ("trpo", "Pendulum-v1", "actor"),
    ("apex_dqn", "CartPole-v1", "exploration_fraction"),
    ("apex_rainbow", "CartPole-v1", "exploration_final_eps"),
    ("apex_rainbow", "CartPole-v1", "loss"),
    ("apex_td3", "Pendulum-v1", "exploration_noise"),
    ("c51", "CartPole-v1", "loss"),
    ("qrdqn", "CartPole-v1", "loss"),
    ("r2d2", "CartPole-v1", "noisy_sigma0"),
    ("agent57", "CartPole-v1", "noisy_sigma0"),
])
def test_an_option_the_algorithm_does_not_have_is_refused(algo, env, key):
    with pytest.raises(UserError, match=f"unknown config key '{algo}.{key}'"):
        build_config(algo, env, sets=[f"{algo}.{key}=0.5"])


def test_another_librarys_lambda_is_refused_for_impala_with_the_reason():
    with pytest.raises(UserError, match="'lambda'.*no counterpart"):
        build_config("impala", "CartPole-v1", sets=["lambda=0.9"])
