"""The key table: every rl-zoo / Stable-Baselines3 key and how corral takes it (``KEYS``), and
SB3's defaults where corral's differ (``SB3_DEFAULTS``). docs/config.md has the same table."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

from corral.zoo.context import Context, Pairs, Refused, _refuse, _refuse_if_set, _same, _schedule
from corral.zoo.literal import parse_literal
from corral.zoo.policy_keys import _normalize, _policy, _policy_kwargs, sde_field


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
    """exploration_noise = noise_std (on actions scaled to [-1, 1], as SB3 adds it); 'ornstein-uhlenbeck': also
    exploration_noise_type: ornstein-uhlenbeck (SB3's OU process, theta 0.15, dt 0.01; td3, ddpg)"""
    if not ctx.has("exploration_noise"):
        raise Refused(f"{ctx.algo} in corral takes no action noise")
    std = ctx.entry.get("noise_std")
    if not isinstance(std, (int, float)) or isinstance(std, bool):
        raise Refused(f"noise_type {value!r} needs a number noise_std, got {std!r}")
    if "ornstein-uhlenbeck" in str(value):
        field = ctx.field("exploration_noise_type", f"{ctx.algo} in corral explores with Gaussian noise only "
                                                    "(noise_type: normal)")
        return [(ctx.field("exploration_noise"), float(std)), (field, "ornstein-uhlenbeck")]
    if "normal" not in str(value):
        raise Refused(f"noise_type {value!r}: corral's {ctx.algo} takes normal or ornstein-uhlenbeck")
    return [(ctx.field("exploration_noise"), float(std))]


def _noise_std(value: Any, ctx: Context) -> Pairs:
    """with noise_type"""
    if "noise_type" not in ctx.entry:
        raise Refused("noise_std without noise_type: SB3 adds no action noise then")
    return []  # read by noise_type


def _use_sde(value: Any, ctx: Context) -> Pairs:
    """use_sde (gSDE: sac, tqc, ppo, a2c, trpo); none when false"""
    if not value:
        return []
    return [(sde_field("use_sde", ctx), True)]


def _sde_key(name: str) -> Callable[[Any, Context], Pairs]:
    def fn(value: Any, ctx: Context) -> Pairs:
        if not ctx.entry.get("use_sde"):
            return []  # SB3 ignores it without use_sde
        return [(sde_field(name, ctx), value)]
    fn.__doc__ = f"{name} with use_sde; none without (SB3 ignores it then)"
    return fn


def _off_policy_n_step(value: Any, ctx: Context) -> Pairs:
    """n_steps (on-policy rollout length) or n_step (n-step returns of replay algorithms)"""
    if ctx.has("n_steps"):
        return [(ctx.field("n_steps"), int(value))]
    return [(ctx.field("n_step"), int(value))]


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
    "optimize_memory_usage": _refuse_if_set(
        "none when false (SB3's default)",
        "SB3's memory-saving replay layout has no switch in corral (its replay stores Atari frames once "
        "already, docs/architecture.md)"),
    "use_sde": _use_sde,
    "sde_sample_freq": _sde_key("sde_sample_freq"),
    "use_sde_at_warmup": _sde_key("use_sde_at_warmup"),
    # refused, with the reason
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
