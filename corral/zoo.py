"""rl-zoo's hyperparameter files as a config source (``--config hyperparams/ppo.yml``, ``--zoo``).

rl-zoo (rl_zoo3) keeps its tuned hyperparameters in one YAML file per algorithm, one
top-level key per env id plus a ``default`` and an ``atari`` entry, in Stable-Baselines3's
names: ``learning_rate: lin_0.001`` schedules, ``n_timesteps``, ``n_envs``, ``normalize``
(VecNormalize), ``policy_kwargs`` written as a Python expression, ``env_wrapper``,
``frame_stack``, ``policy``. This module reads such a file's entry for one env and maps
every key to corral's config; a key corral cannot honour is refused with its reason (or,
with ``lenient``, reported on stderr and skipped). Nothing is silently ignored.

``policy_kwargs`` (and ``normalize`` written as a string) are read by :func:`parse_literal`,
a restricted parser over Python's ``ast``: literals, ``dict(...)`` / ``{...}``, lists and a
whitelist of names (``nn.ReLU``, ``th.nn.Tanh``, ...). Nothing is ever ``eval``-ed.

The entry replaces corral's own preset for (algo, env), and the fields an entry leaves
unset take Stable-Baselines3's defaults where corral's differ (``SB3_DEFAULTS``), so a run
is the one rl-zoo would launch. docs/config.md ("rl-zoo's hyperparameter files") has the
table for users.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from corral.errors import UserError

ZOO_SPECIAL = ("default", "atari")


# ---------------------------------------------------------------------------
# The layout: one top-level key per env id, each a mapping of SB3 hyperparameters.


def is_zoo_layout(data: Any) -> bool:
    """True for rl-zoo's layout: every top-level value a mapping, and at least one of them an
    rl-zoo entry (it has ``n_timesteps`` or ``policy``, which every rl-zoo entry has and no
    corral section does)."""
    if not isinstance(data, dict) or not data:
        return False
    if not all(isinstance(v, dict) for v in data.values()):
        return False
    return any("n_timesteps" in v or "policy" in v for v in data.values())


def select_entry(data: dict, env_id: str, is_atari: bool, source: str = "the file") -> tuple[str, dict]:
    """The entry for ``env_id`` (its own key, else ``atari`` for an ALE game, else ``default``),
    as rl-zoo's ``ExperimentManager.read_hyperparameters`` picks it. Returns ``(key, entry)``."""
    for key in (env_id, env_id.removeprefix("native:")):
        if key in data:
            return key, dict(data[key])
    if is_atari and "atari" in data:
        return "atari", dict(data["atari"])
    if "default" in data:
        return "default", dict(data["default"])
    envs = ", ".join(k for k in data if k not in ZOO_SPECIAL)
    raise UserError(f"{source} has no entry for {env_id!r} and no 'default' entry; its envs: {envs}")


def bundled_file(algo: str) -> Path:
    """``rl_zoo3/hyperparams/<algo>.yml`` of the installed rl_zoo3 (found without importing it,
    which would import Stable-Baselines3)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--zoo reads rl-zoo's bundled hyperparameter files from the rl_zoo3 package, which is not "
                        "installed: pip install 'corral[zoo]' (or give a file: --config path/to/hyperparams/ALGO.yml)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "hyperparams"
    path = folder / f"{algo}.yml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in folder.glob("*.yml")))
        raise UserError(f"rl-zoo has no hyperparameter file for {algo!r} ({folder}); it has: {have}")
    return path


def bundled_files() -> list[Path]:
    """Every ``rl_zoo3/hyperparams/*.yml`` (``corral list --zoo``, benchmarks/zoo_entries.py)."""
    return sorted(bundled_file("ppo").parent.glob("*.yml"))


# ---------------------------------------------------------------------------
# Restricted literal parser for policy_kwargs and normalize strings.


@dataclass(frozen=True)
class Name:
    """A whitelisted name in a parsed expression (``nn.ReLU``), kept as text: it maps to a
    corral setting (activation: relu) or is refused with a reason; it is never imported."""

    name: str

    def __repr__(self) -> str:
        return self.name


# Written forms -> the canonical name. Activations, plus the optimizer rl-zoo's A2C Atari entry names.
_ACTIVATIONS = ("ReLU", "Tanh", "ELU", "SiLU", "GELU", "LeakyReLU", "Sigmoid", "Softplus", "Mish", "Identity")
ALLOWED_NAMES: dict[str, str] = {}
for _act in _ACTIVATIONS:
    for _prefix in ("nn.", "th.nn.", "torch.nn."):
        ALLOWED_NAMES[_prefix + _act] = "nn." + _act
for _opt in ("Adam", "AdamW", "RMSprop", "SGD"):
    for _prefix in ("th.optim.", "torch.optim.", "optim."):
        ALLOWED_NAMES[_prefix + _opt] = "optim." + _opt
ALLOWED_NAMES["RMSpropTFLike"] = "RMSpropTFLike"


def parse_literal(text: str, what: str = "policy_kwargs") -> Any:
    """Parse ``text`` as a literal: numbers, strings, True/False/None, lists and tuples (as
    lists), ``{...}`` and ``dict(key=value, ...)``, and the names in ``ALLOWED_NAMES`` (as
    :class:`Name`). Anything else (calls other than ``dict``, attribute access outside the
    whitelist, operators, comprehensions, ``__import__('os')``) raises a ``UserError``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise UserError(f"{what}: {text!r} is not a Python expression ({e.msg})") from None
    return _literal(tree.body, what, text)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.AST, what: str, text: str) -> Any:
    def refuse(part: str) -> UserError:
        return UserError(f"{what}: {part} is not allowed in {text!r}; corral reads only literals, dict(...), "
                         "lists and the names nn.ReLU, nn.Tanh, nn.ELU, nn.SiLU, ... (nothing is evaluated)")

    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float, str, bool)) or node.value is None:
            return node.value
        raise refuse(repr(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)) \
            and not isinstance(node.operand.value, bool):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, what, text) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise refuse("'**' unpacking")
            key = _literal(k, what, text)
            if not isinstance(key, str):
                raise refuse(f"the key {key!r}")
            out[key] = _literal(v, what, text)
        return out
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "dict"):
            raise refuse(f"the call {ast.unparse(node.func)}(...)")
        if node.args or any(kw.arg is None for kw in node.keywords):
            raise refuse("dict(...) with positional or '**' arguments")
        return {kw.arg: _literal(kw.value, what, text) for kw in node.keywords}
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        if name in ("True", "False", "None"):  # pragma: no cover (Constants since Python 3.8)
            return {"True": True, "False": False, "None": None}[name]
        if name is not None and name in ALLOWED_NAMES:
            return Name(ALLOWED_NAMES[name])
        raise refuse(f"the name {ast.unparse(node)}")
    raise refuse(f"the expression {ast.unparse(node)!r}")


def parse_schedule(value: Any, key: str) -> tuple[str, float]:
    """rl-zoo's schedule values: a number (constant) or ``lin_X`` (linear from X to 0 over
    the run, rl-zoo's ``SimpleLinearSchedule``). Returns ``("constant" | "linear", X)``."""
    if isinstance(value, bool):
        raise UserError(f"{key}: expected a number or 'lin_X', got {value!r}")
    if isinstance(value, (int, float)):
        return "constant", float(value)
    if isinstance(value, str):
        kind, sep, number = value.partition("_")
        if kind == "lin" and sep:
            try:
                return "linear", float(number)
            except ValueError:
                pass
        try:
            return "constant", float(value)  # "1e-3" written as a string
        except ValueError:
            pass
    raise UserError(f"{key}: {value!r} is not a schedule corral knows; write a number or 'lin_X' "
                    "(linear from X to 0 over the run)")


# ---------------------------------------------------------------------------
# The key table.


class Refused(Exception):
    """A key corral cannot honour; the message is the reason (and the fix where there is one)."""


@dataclass
class Context:
    """What a key's mapping may look at: the algorithm (name and config class), the env, the
    whole entry (keys that go in pairs, such as noise_type and noise_std)."""

    algo: str
    algo_cfg: Any
    env_id: str
    is_atari: bool
    entry: dict
    refused: dict = field(default_factory=dict)  # sub-keys refused by a key that is otherwise taken

    def has(self, name: str) -> bool:
        return any(f.name == name for f in dataclasses.fields(self.algo_cfg))

    def field(self, name: str, why: str = "") -> str:
        """``<algo>.<name>``, or Refused when the algorithm has no such field."""
        if not self.has(name):
            raise Refused(why or f"{self.algo} in corral has no {name!r}")
        return f"{self.algo}.{name}"


Pairs = list[tuple[str, Any]]


def _same(name: str, target: str | None = None) -> Callable[[Any, Context], Pairs]:
    """A key corral has under this name (or ``target``) in the algorithm's section."""
    def fn(value: Any, ctx: Context) -> Pairs:
        return [(ctx.field(target or name), value)]
    fn.__doc__ = f"{target or name}"
    return fn


def _schedule(value_key: str, schedule_key: str | None) -> Callable[[Any, Context], Pairs]:
    def fn(value: Any, ctx: Context) -> Pairs:
        kind, x = parse_schedule(value, value_key)
        if value_key == "clip_range_vf" and kind == "constant" and x < 0:
            return [(ctx.field(value_key), None)]  # rl-zoo: a negative clip means none
        pairs = [(ctx.field(value_key), x)]
        if schedule_key is not None and ctx.has(schedule_key):
            pairs.append((ctx.field(schedule_key), kind))
        elif kind == "linear":
            raise Refused(f"{ctx.algo} in corral has no linear schedule for {value_key}; write a constant")
        return pairs
    fn.__doc__ = f"{value_key}" + (f" and {schedule_key} (lin_X: linear)" if schedule_key else "")
    return fn


def _steps(value: Any, ctx: Context) -> Pairs:
    """steps (the budget, unless --steps is given)"""
    return [("steps", int(float(value)))]


def _n_envs(value: Any, ctx: Context) -> Pairs:
    """env.num_envs"""
    return [("env.num_envs", int(value))]


def _env_kwargs(value: Any, ctx: Context) -> Pairs:
    """env.kwargs"""
    if isinstance(value, str):
        value = parse_literal(value, "env_kwargs")
    if not isinstance(value, dict):
        raise Refused(f"expected a mapping of env arguments, got {value!r}")
    return [("env.kwargs", value)]


_RECURRENT_POLICIES = ("MlpLstmPolicy", "CnnLstmPolicy", "MultiInputLstmPolicy")


def _policy(value: Any, ctx: Context) -> Pairs:
    """none: corral picks the network from the observation space (MLP, CNN for images, both for Dict); ars:
    LinearPolicy hidden [], MlpPolicy hidden [64, 64] unless policy_kwargs gives net_arch"""
    if ctx.has("n_delta"):  # ARS: sb3-contrib's LinearPolicy (no bias) or MlpPolicy (64x64 by default)
        if value == "LinearPolicy":
            return [(ctx.field("hidden"), [])]
        if value == "MlpPolicy":
            kw = ctx.entry.get("policy_kwargs")
            try:
                kw = parse_literal(kw, "policy_kwargs") if isinstance(kw, str) else kw
            except UserError:
                kw = None  # refused under policy_kwargs itself
            return [] if isinstance(kw, dict) and "net_arch" in kw else [(ctx.field("hidden"), [64, 64])]
        raise Refused(f"{value!r}: sb3-contrib's ARS policies are LinearPolicy and MlpPolicy")
    if value in ("MlpPolicy", "CnnPolicy", "MultiInputPolicy"):
        return []
    if value in _RECURRENT_POLICIES:
        if ctx.algo in ("ppo_lstm", "impala_lstm"):
            return []
        raise Refused(f"{value} is a recurrent policy; corral's recurrent PPO is ppo_lstm")
    raise Refused(f"{value!r} is not one of SB3's built-in policies (MlpPolicy, CnnPolicy, MultiInputPolicy); "
                  "corral builds its own networks (a custom one is a features=... class, docs/tutorial.md)")


def _normalize(value: Any, ctx: Context) -> Pairs:
    """normalize_obs / normalize_reward (VecNormalize's norm_obs / norm_reward; clip_reward: reward_clip)"""
    if isinstance(value, bool):
        kwargs = {"norm_obs": value, "norm_reward": value}
    else:
        if isinstance(value, str):
            value = parse_literal(value, "normalize")
        if not isinstance(value, dict):
            raise Refused(f"expected true/false or VecNormalize's keyword arguments, got {value!r}")
        kwargs = {"norm_obs": True, "norm_reward": True, **value}
    pairs: Pairs = []
    for k, v in kwargs.items():
        if k == "norm_obs":
            if v or ctx.has("normalize_obs"):
                pairs.append((ctx.field("normalize_obs", f"{ctx.algo} in corral has no observation normalization"),
                              bool(v)))
        elif k == "norm_reward":
            if v or ctx.has("normalize_reward"):
                pairs.append((ctx.field("normalize_reward", f"{ctx.algo} in corral has no reward normalization "
                                        "(normalize_reward is PPO's and A2C's)"), bool(v)))
        elif k == "clip_reward":
            pairs.append((ctx.field("reward_clip", f"{ctx.algo} in corral has no reward normalization"), float(v)))
        elif k == "clip_obs" and float(v) == 10.0:
            pass  # corral's observation normalizer clips at 10, VecNormalize's default
        elif k == "epsilon" and float(v) == 1e-8:
            pass  # corral's normalizer epsilon, VecNormalize's default
        elif k == "gamma":
            pass  # rl-zoo overwrites it with the entry's gamma, which corral's reward scaling uses too
        else:
            raise Refused(f"VecNormalize({k}={v!r}) has no counterpart in corral's normalizers "
                          "(they clip observations at 10 and use epsilon 1e-8)")
    return pairs


_ACTIVATION = {"nn.Tanh": "tanh", "nn.ReLU": "relu", "nn.ELU": "elu", "nn.SiLU": "silu"}


def _policy_kwargs(value: Any, ctx: Context) -> Pairs:
    """hidden (net_arch), activation (activation_fn), log_std_init, n_critics, n_quantiles, critic_hidden
    (CrossQ's qf), core_size / core_layers / shared_core (ppo_lstm); each other key refused with its reason"""
    if isinstance(value, str):
        value = parse_literal(value, "policy_kwargs")
    if not isinstance(value, dict):
        raise Refused(f"expected dict(...), got {value!r}")
    pairs: Pairs = []
    for k, v in value.items():  # each argument on its own: --lenient skips only the ones refused
        try:
            pairs += _policy_kwarg(k, v, value, ctx)
        except Refused as e:
            ctx.refused[f"policy_kwargs.{k}"] = str(e)
    return pairs


def _sizes(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise Refused(f"{what}: expected a list of layer sizes, got {v!r}")
    return v


def _policy_kwarg(k: str, v: Any, allkw: dict, ctx: Context) -> Pairs:
    if k == "net_arch":
        if isinstance(v, list):
            pairs = [(ctx.field("hidden"), _sizes(v, "net_arch"))]
            if ctx.has("critic_hidden"):
                pairs.append((ctx.field("critic_hidden"), None))  # None: the same sizes as hidden
            return pairs
        if isinstance(v, dict):
            unknown = set(v) - {"pi", "vf", "qf"}
            if unknown:
                raise Refused(f"net_arch keys {sorted(unknown)}: SB3 knows pi, vf and qf")
            pi = _sizes(v.get("pi", []), "net_arch pi")
            other_key = "qf" if "qf" in v else "vf"
            other = _sizes(v.get(other_key, []), f"net_arch {other_key}")
            if other_key == "qf" and ctx.has("critic_hidden"):
                return [(ctx.field("hidden"), pi), (ctx.field("critic_hidden"), other)]
            if pi != other:
                raise Refused(f"separate sizes for the actor ({pi}) and the {'critic' if other_key == 'qf' else 'value'}"
                              f" network ({other}); corral's {ctx.algo} has one list, hidden, for both")
            return [(ctx.field("hidden"), pi)]
        raise Refused(f"expected a list or dict(pi=..., vf=...), got {v!r}")
    if k == "activation_fn":
        name = v.name if isinstance(v, Name) else str(v)
        if name not in _ACTIVATION:
            raise Refused(f"{name} is not one of corral's activations (nn.Tanh, nn.ReLU, nn.ELU, nn.SiLU)")
        return [(ctx.field("activation"), _ACTIVATION[name])]
    if k == "log_std_init":
        return [(ctx.field("log_std_init", f"{ctx.algo} in corral has no log_std_init (SB3 uses it with gSDE)"),
                 float(v))]
    if k == "ortho_init":
        if v:
            return []  # corral's actor-critic networks are initialized orthogonally, as SB3's default
        raise Refused("corral's actor-critic networks are always initialized orthogonally (SB3's ortho_init=True); "
                      "there is no key to turn it off")
    if k in ("n_critics", "n_quantiles"):
        return [(ctx.field(k), int(v))]
    if k == "lstm_hidden_size":
        return [(ctx.field("core_size"), int(v))]
    if k == "n_lstm_layers":
        return [(ctx.field("core_layers"), int(v))]
    if k in ("enable_critic_lstm", "shared_lstm"):
        shared = bool(allkw.get("shared_lstm", False))
        critic = bool(allkw.get("enable_critic_lstm", not shared))
        if k == "shared_lstm" and "enable_critic_lstm" in allkw:
            return []  # decided with enable_critic_lstm
        if shared:
            return [(ctx.field("shared_core"), True)]
        if critic:
            return [(ctx.field("shared_core"), False)]  # a critic LSTM of its own
        raise Refused("a critic without a recurrent core (enable_critic_lstm=False, shared_lstm=False) has no "
                      "counterpart: corral's ppo_lstm value head reads a core, shared (shared_core=true) or its own")
    if k == "optimizer_class":
        name = v.name if isinstance(v, Name) else str(v)
        if name == "RMSpropTFLike":
            raise Refused("TensorFlow-style RMSprop (epsilon inside the square root) is not in corral; "
                          "a2c uses torch's RMSprop (a2c.optimizer: rmsprop, as SB3's default)")
        if name == "optim.Adam" and ctx.has("optimizer"):
            return [(ctx.field("optimizer"), "adam")]
        if name == "optim.RMSprop" and ctx.has("optimizer"):
            return [(ctx.field("optimizer"), "rmsprop")]
        if name == "optim.Adam" and not ctx.has("optimizer"):
            return []  # every other corral algorithm uses Adam, as SB3's default
        raise Refused(f"{name}: corral's {ctx.algo} has no optimizer choice for it")
    if k == "optimizer_kwargs":
        if not isinstance(v, dict):
            raise Refused(f"expected dict(...), got {v!r}")
        pairs = []
        for ok, ov in v.items():
            if ok == "eps":
                pairs.append((ctx.field("eps") if ctx.has("eps") else ctx.field("adam_eps"), float(ov)))
            elif ok == "alpha":
                pairs.append((ctx.field("rms_alpha"), float(ov)))
            else:
                raise Refused(f"optimizer argument {ok!r} has no counterpart in corral's {ctx.algo}")
        return pairs
    if k == "use_expln":
        raise Refused("use_expln is part of gSDE (generalized State-Dependent Exploration), which corral does not have")
    raise Refused(f"SB3's policy argument {k!r} has no counterpart in corral")


def _env_wrapper(value: Any, ctx: Context) -> Pairs:
    """env.atari_wrappers (SB3's AtariWrapper with its defaults is corral's Atari preprocessing); any other wrapper
    whose package is installed: env.wrappers, with its arguments (imported when the envs are made)"""
    items = value if isinstance(value, list) else [value]
    pairs: Pairs = []
    others: list = []  # env.wrappers, in the entry's order (outside corral's Atari preprocessing)
    for item in items:
        if isinstance(item, dict):
            if len(item) != 1:
                raise Refused(f"expected one wrapper per list item, got {item!r}")
            (name, kwargs), = item.items()
        else:
            name, kwargs = item, {}
        kwargs = kwargs or {}
        if name == "stable_baselines3.common.atari_wrappers.AtariWrapper":
            if others:
                raise Refused("AtariWrapper after another wrapper: corral's Atari preprocessing is the innermost")
            if not ctx.is_atari:
                raise Refused(f"AtariWrapper on {ctx.env_id!r}, which is not an ALE game")
            same = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "terminal_on_life_loss": True,
                    "clip_reward": True}
            differ = {k: v for k, v in kwargs.items() if same.get(k, object()) != v}
            if differ:
                args = ", ".join(f"{k}={v!r}" for k, v in differ.items())
                raise Refused(f"AtariWrapper({args}): corral's Atari preprocessing (noop 30, frame skip 4, 84x84 gray, "
                              "episodic life, reward clipping, fire reset) is on or off (env.atari_wrappers), "
                              "its settings are not config keys")
            pairs.append(("env.atari_wrappers", True))
            continue
        if not isinstance(name, str) or not isinstance(kwargs, dict):
            raise Refused(f"expected a wrapper's import path, or {{path: {{argument: value}}}}, got {item!r}")
        package = name.replace(":", ".").split(".")[0]
        if not package or importlib.util.find_spec(package) is None:  # (found, not imported: an import can patch Gymnasium)
            raise Refused(f"{name}: its package {package!r} is not installed here")
        others.append({name: dict(kwargs)} if kwargs else name)
    if others:
        pairs.append(("env.wrappers", others))
    return pairs


def _frame_stack(value: Any, ctx: Context) -> Pairs:
    """none when 4 on an ALE game (corral's Atari preprocessing stacks 4 frames); else refused"""
    if ctx.is_atari and int(value) == 4:
        return [("env.atari_wrappers", True)]
    if ctx.is_atari:
        raise Refused(f"frame_stack={value}: corral's Atari preprocessing stacks 4 frames and has no key to change it")
    raise Refused("corral stacks frames only in its Atari preprocessing; for other envs wrap the env in a factory "
                  "(gymnasium.wrappers.FrameStackObservation) and give it as ENV")


def _train_freq(value: Any, ctx: Context) -> Pairs:
    """train_freq (an int, or [n, 'step'])"""
    if isinstance(value, list) and len(value) == 2:
        n, unit = value
        if unit == "step":
            value = n
        else:
            raise Refused(f"train_freq={value}: corral updates every n vector steps; per-episode updates "
                          "([n, 'episode']) are not in corral")
    return [(ctx.field("train_freq"), int(value))]


def _ent_coef(value: Any, ctx: Context) -> Pairs:
    """ent_coef ('auto': null, tuned; 'auto_X': tuned from X, ent_coef_init)"""
    if isinstance(value, str) and value.startswith("auto"):
        if not ctx.has("ent_coef_init"):
            raise Refused(f"ent_coef={value!r}: {ctx.algo} in corral does not tune its entropy coefficient")
        pairs = [(ctx.field("ent_coef"), None)]
        if "_" in value:
            pairs.append((ctx.field("ent_coef_init"), float(value.partition("_")[2])))
        return pairs
    return [(ctx.field("ent_coef"), float(value))]


def _target_entropy(value: Any, ctx: Context) -> Pairs:
    """target_entropy ('auto': null, -action_dim)"""
    return [(ctx.field("target_entropy"), None if value == "auto" else float(value))]


def _use_rms_prop(value: Any, ctx: Context) -> Pairs:
    """optimizer: rmsprop / adam"""
    return [(ctx.field("optimizer"), "rmsprop" if value else "adam")]


def _noise_type(value: Any, ctx: Context) -> Pairs:
    """exploration_noise = noise_std (Gaussian noise on actions scaled to [-1, 1], as SB3 adds it)"""
    if not ctx.has("exploration_noise"):
        raise Refused(f"{ctx.algo} in corral takes no action noise")
    if "normal" not in str(value) or "ornstein" in str(value):
        raise Refused(f"noise_type {value!r}: corral's {ctx.algo} explores with Gaussian noise only (noise_type: normal)")
    std = ctx.entry.get("noise_std")
    if not isinstance(std, (int, float)) or isinstance(std, bool):
        raise Refused(f"noise_type normal needs a number noise_std, got {std!r}")
    return [(ctx.field("exploration_noise"), float(std))]


def _noise_std(value: Any, ctx: Context) -> Pairs:
    """with noise_type"""
    if "noise_type" not in ctx.entry:
        raise Refused("noise_std without noise_type: SB3 adds no action noise then")
    return []  # read by noise_type


def _use_sde(value: Any, ctx: Context) -> Pairs:
    """none when false; true refused (no gSDE in corral)"""
    if not value:
        return []
    raise Refused("corral has no generalized State-Dependent Exploration (gSDE); its Gaussian policies sample "
                  "independent noise each step")


def _with_sde(value: Any, ctx: Context) -> Pairs:
    """with use_sde"""
    if not ctx.entry.get("use_sde"):
        return []  # SB3 ignores it without use_sde
    raise Refused("part of gSDE (use_sde), which corral does not have")


def _optimize_memory_usage(value: Any, ctx: Context) -> Pairs:
    """none when false (SB3's default)"""
    if not value:
        return []
    raise Refused("SB3's memory-saving replay layout has no switch in corral (its replay stores Atari frames once "
                  "already, docs/architecture.md)")


def _off_policy_n_step(value: Any, ctx: Context) -> Pairs:
    """n_steps (on-policy rollout length) or n_step (n-step returns of replay algorithms)"""
    if ctx.has("n_steps"):
        return [(ctx.field("n_steps"), int(value))]
    return [(ctx.field("n_step"), int(value))]


def _refuse(reason: str) -> Callable[[Any, Context], Pairs]:
    def fn(value: Any, ctx: Context) -> Pairs:
        raise Refused(reason)
    fn.__doc__ = f"refused: {reason}"
    return fn


_HER = ("rl-zoo 1.x's her.yml layout (model_class and HER's keys at the top level); SB3 >= 1.1 and corral name "
        "the algorithm's own file with replay_buffer_class: HerReplayBuffer")
# HerReplayBuffer's keyword arguments -> corral's (replay=her); the others are handled in _her_kwarg
_HER_KWARGS = {"goal_selection_strategy": "her_strategy", "n_sampled_goal": "her_n_sampled_goal"}


def _replay_buffer_class(value: Any, ctx: Context) -> Pairs:
    """replay=her for HerReplayBuffer (corral/storage/her.py); none for SB3's ReplayBuffer / DictReplayBuffer"""
    name = str(value).rsplit(".", 1)[-1]
    if name == "HerReplayBuffer":
        return [(ctx.field("replay", f"{ctx.algo} in corral keeps its own replay; HER is for sac, td3, ddpg, dqn "
                                     "and their variants"), "her")]
    if name in ("ReplayBuffer", "DictReplayBuffer"):
        return []
    raise Refused(f"{value!r}: corral's replay is uniform, prioritized (prioritized: true) or HER (HerReplayBuffer)")


def _her_kwarg(k: str, v: Any, ctx: Context) -> Pairs:
    if k in _HER_KWARGS:
        if k == "goal_selection_strategy":
            v = str(v).rsplit(".", 1)[-1].lower()  # 'future' or GoalSelectionStrategy.FUTURE
        return [(ctx.field(_HER_KWARGS[k]), v)]
    if k == "online_sampling" and v:
        return []  # corral relabels at sampling time, as SB3 >= 1.8 always does
    if k == "max_episode_length":
        return []  # SB3 < 1.8's episode-shaped storage; corral's finds episode ends from the flags
    if k == "handle_timeout_termination" and v:
        return []  # corral always bootstraps at a truncation
    if k == "copy_info_dict" and not v:
        return []  # corral keeps no infos: compute_reward gets an empty dict per row, as with SB3's default
    raise Refused(f"HerReplayBuffer's {k}={v!r} has no counterpart in corral's HER")


def _replay_buffer_kwargs(value: Any, ctx: Context) -> Pairs:
    """her_strategy (goal_selection_strategy), her_n_sampled_goal (n_sampled_goal); online_sampling=True,
    max_episode_length, handle_timeout_termination=True: nothing to set; each other key refused"""
    if isinstance(value, str):
        value = parse_literal(value, "replay_buffer_kwargs")
    if not isinstance(value, dict):
        raise Refused(f"expected dict(...), got {value!r}")
    if not value:
        return []
    if str(ctx.entry.get("replay_buffer_class", "")).rsplit(".", 1)[-1] != "HerReplayBuffer":
        raise Refused("corral takes replay_buffer_kwargs for HerReplayBuffer only")
    pairs: Pairs = []
    for k, v in value.items():  # each argument on its own: --lenient skips only the ones refused
        try:
            pairs += _her_kwarg(k, v, ctx)
        except Refused as e:
            ctx.refused[f"replay_buffer_kwargs.{k}"] = str(e)
    return pairs


# rl-zoo key -> how corral takes it: a function of (value, Context) returning (corral key, value)
# pairs, or raising Refused with the reason. Its docstring is the table's second column
# (docs/config.md has the same table).
KEYS: dict[str, Callable[[Any, Context], Pairs]] = {
    # what the run is
    "n_timesteps": _steps,
    "n_envs": _n_envs,
    "policy": _policy,
    "env_kwargs": _env_kwargs,
    "env_wrapper": _env_wrapper,
    "frame_stack": _frame_stack,
    "normalize": _normalize,
    "policy_kwargs": _policy_kwargs,
    # schedules
    "learning_rate": _schedule("lr", "lr_schedule"),
    "clip_range": _schedule("clip_range", "clip_schedule"),
    "clip_range_vf": _schedule("clip_range_vf", None),
    # the same name in corral
    **{k: _same(k) for k in (
        "gamma", "gae_lambda", "n_epochs", "batch_size", "vf_coef", "max_grad_norm", "normalize_advantage",
        "target_kl", "buffer_size", "learning_starts", "tau", "gradient_steps", "target_update_interval",
        "exploration_fraction", "exploration_initial_eps", "exploration_final_eps", "policy_delay",
        "target_noise_clip", "top_quantiles_to_drop_per_net", "n_quantiles")},
    "n_steps": _off_policy_n_step,
    "target_policy_noise": _same("target_policy_noise", "target_noise"),
    "rms_prop_eps": _same("rms_prop_eps", "eps"),
    "use_rms_prop": _use_rms_prop,
    "train_freq": _train_freq,
    "ent_coef": _ent_coef,
    "target_entropy": _target_entropy,
    "noise_type": _noise_type,
    "noise_std": _noise_std,
    "optimize_memory_usage": _optimize_memory_usage,
    # refused, with the reason
    "use_sde": _use_sde,
    "sde_sample_freq": _with_sde,
    "use_sde_at_warmup": _with_sde,
    "replay_buffer_class": _replay_buffer_class,
    "replay_buffer_kwargs": _replay_buffer_kwargs,
    "model_class": _refuse(_HER),
    "n_sampled_goal": _refuse(_HER),
    "goal_selection_strategy": _refuse(_HER),
    "online_sampling": _refuse(_HER),
    "max_episode_length": _refuse(_HER),
    # sb3-contrib's TRPO and ARS: the same names in corral's trpo / ars
    **{k: _same(k) for k in ("n_critic_updates", "cg_damping", "cg_max_steps", "line_search_shrinking_factor",
                             "line_search_max_iter", "sub_sampling_factor", "n_delta", "n_top", "delta_std",
                             "zero_policy", "alive_bonus_offset")},
    "callback": _refuse("rl-zoo's callbacks are SB3 code run inside its training loop; corral's hooks are "
                        "corral.train.hooks (docs/architecture.md)"),
    "vec_env_wrapper": _refuse("corral has no vector-env wrapper key"),
    "monitor_kwargs": _refuse("corral writes per-episode Monitor CSVs with log.monitor_csv; SB3's Monitor "
                              "arguments have no counterpart"),
}


# Stable-Baselines3's defaults where corral's differ: applied before an entry, so a key the
# entry leaves out has SB3's value, as in the run rl-zoo launches. (Measured against SB3 2.9 /
# sb3-contrib 2.9 constructors and policies.)
SB3_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {"n_steps": 2048},
    "ppo_lstm": {"batch_size": 128, "core_size": 256, "shared_core": False, "hidden": [64, 64]},
    "dqn": {"learning_starts": 100, "hidden": [64, 64]},
    "qrdqn": {"lr": 5e-5, "learning_starts": 100, "exploration_fraction": 0.005, "exploration_final_eps": 0.01,
              "max_grad_norm": None, "hidden": [64, 64]},
    # SB3's TD3 / DDPG add no action noise unless the entry names one (noise_type)
    "td3": {"lr": 1e-3, "learning_starts": 100, "hidden": [400, 300], "exploration_noise": 0.0},
    "ddpg": {"lr": 1e-3, "learning_starts": 100, "hidden": [400, 300], "exploration_noise": 0.0},
}


# ---------------------------------------------------------------------------
# Translation of one entry.


@dataclass
class Translation:
    """An entry in corral's terms: ``pairs`` (dotted corral keys and values, in order),
    ``refused`` (rl-zoo key -> reason), where it came from."""

    algo: str
    env_id: str
    entry_key: str
    source: str
    pairs: list[tuple[str, Any]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rl-zoo entry {self.entry_key!r} of {self.source}"


def translate(algo: str, data: dict, env_id: str, *, is_atari: bool, source: str = "the file",
              algo_cfg: Any = None) -> Translation:
    """Map the entry of ``data`` (an rl-zoo file) for ``env_id`` to corral's keys."""
    if algo_cfg is None:
        from corral.algos import get_algo

        algo_cfg = get_algo(algo).cls.Config()
    key, entry = select_entry(data, env_id, is_atari, source)
    ctx = Context(algo=algo, algo_cfg=algo_cfg, env_id=env_id, is_atari=is_atari, entry=entry)
    out = Translation(algo=algo, env_id=env_id, entry_key=key, source=source)
    for name, value in SB3_DEFAULTS.get(algo, {}).items():
        out.pairs.append((f"{algo}.{name}", value))
    for k, v in entry.items():
        fn = KEYS.get(k)
        if fn is None:
            out.refused[k] = "not a key corral knows from rl-zoo or Stable-Baselines3"
            continue
        try:
            out.pairs += fn(v, ctx)
        except Refused as e:
            out.refused[k] = str(e)
        except UserError as e:  # a bad value (a schedule, a policy_kwargs expression)
            out.refused[k] = str(e)
        out.refused.update(ctx.refused)
        ctx.refused.clear()
    return out


def refusal_message(t: Translation) -> str:
    """One message naming every refused key, its reason and the fix."""
    parts = "; ".join(f"{k!r}: {why}" for k, why in t.refused.items())
    n = len(t.refused)
    return (f"{t.label} for {t.algo}: corral cannot honour {'this key' if n == 1 else f'these {n} keys'}: {parts}. "
            "Fix: remove or change the key in the file, or pass --lenient to run without "
            f"{'it' if n == 1 else 'them'} (each is reported)")


def apply(cfg: Any, t: Translation, *, lenient: bool = False) -> None:
    """Apply a translation onto a TrainConfig (checking every value as ``--set`` does). Refused
    keys raise one ``UserError``, or with ``lenient`` are reported on stderr, one line each."""
    from corral import config as C

    if t.refused:
        if not lenient:
            raise UserError(refusal_message(t))
        for k, why in t.refused.items():
            print(f"corral: warning: {t.label}: skipped {k!r} (--lenient): {why}", file=sys.stderr)
    for key, value in t.pairs:
        try:
            C.apply_set(cfg, [(key, value)])
        except UserError as e:
            raise UserError(f"{t.label}: {e}") from None


def load_entry(algo: str, env_id: str, *, path: str | None = None, data: dict | None = None,
               is_atari: bool = False, algo_cfg: Any = None) -> Translation:
    """Read an rl-zoo file (``path``, else rl_zoo3's bundled ``<algo>.yml``) and translate its entry."""
    from corral import config as C

    if data is None:
        path = str(path or bundled_file(algo))
        data = C.load_yaml(path)
        if not is_zoo_layout(data):
            raise UserError(f"{path!r} is not in rl-zoo's layout (one entry per env id with n_timesteps / policy)")
    return translate(algo, data, env_id, is_atari=is_atari, source=path or "the file", algo_cfg=algo_cfg)


def missing_algo_reason(algo: str) -> str:
    """Why a bundled file's algorithm is not one corral runs."""
    if algo == "her":
        return ("her.yml is rl-zoo 1.x's layout (model_class names the algorithm); corral's HER is the replay of "
                "sac / td3 / ddpg / dqn (replay: her), given in the algorithm's own file as replay_buffer_class: "
                "HerReplayBuffer, as SB3 >= 1.1 writes it")
    return f"corral has no {algo!r}"


def list_entries() -> list[dict]:
    """Every entry of rl_zoo3's bundled files: algo, env, and "ok" or the refusal reasons
    (``corral list --zoo``). Env ids that are not registered here are reported as such."""
    import gymnasium as gym

    from corral import config as C
    from corral.algos import ALGOS

    rows = []
    for path in bundled_files():
        algo = path.stem
        data = C.load_yaml(str(path))
        for env_id in data:
            row = {"algo": algo, "env": env_id, "status": "ok", "reasons": {}}
            if algo not in ALGOS:
                row["status"] = "refused"
                row["reasons"] = {"algo": missing_algo_reason(algo)}
                rows.append(row)
                continue
            if env_id not in ZOO_SPECIAL:
                try:
                    gym.spec(env_id)
                except Exception:
                    row["status"] = "not installed"
            t = translate(algo, data, env_id, is_atari=env_id == "atari", source=str(path))
            if t.refused:
                row["status"] = "refused" if row["status"] == "ok" else row["status"]
                row["reasons"] = dict(t.refused)
            rows.append(row)
    return rows


def describe_keys() -> list[tuple[str, str]]:
    """The table's rows: rl-zoo key, what corral does with it (tests check docs/config.md has each key)."""
    return [(k, (fn.__doc__ or "").strip().split("\n")[0]) for k, fn in KEYS.items()]
