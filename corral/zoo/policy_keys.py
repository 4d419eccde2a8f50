"""rl-zoo's network keys in corral's terms: ``policy``, ``normalize`` (VecNormalize) and
``policy_kwargs`` (each argument on its own, so ``--lenient`` skips only the ones refused)."""

from __future__ import annotations

from typing import Any

from corral.errors import UserError
from corral.zoo.context import Context, Pairs, Refused
from corral.zoo.literal import Name, parse_literal

_RECURRENT_POLICIES = ("MlpLstmPolicy", "CnnLstmPolicy", "MultiInputLstmPolicy")

# the algorithms with gSDE (corral.algos.sde); sb3-contrib's CrossQ and RecurrentPPO have it too
SDE_ALGOS = ("sac", "tqc", "ppo", "a2c", "trpo")


def sde_field(name: str, ctx: Context) -> str:
    """``<algo>.<name>`` for a gSDE key, or Refused where the algorithm has no gSDE in corral."""
    if ctx.algo not in SDE_ALGOS:
        raise Refused(f"gSDE (use_sde) is in corral's {', '.join(SDE_ALGOS)}; {ctx.algo} in corral has none")
    return ctx.field(name)


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
    (CrossQ's qf), core_size / core_layers / shared_core (ppo_lstm), use_expln / full_std (with use_sde; none
    without); each other key refused with its reason"""
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
        if ctx.has("use_sde_at_warmup") and not ctx.entry.get("use_sde"):
            return []  # SB3's SAC and TQC read it only with gSDE (their plain actor outputs its log std)
        return [(ctx.field("log_std_init", f"{ctx.algo} in corral has no log_std_init (SB3 uses it with gSDE)"),
                 float(v))]
    if k == "ortho_init":  # SB3's orthogonal init (True, the default) or nn.Linear's own (False)
        return [(ctx.field("init", f"{ctx.algo} in corral has no init option (SB3's ortho_init is an actor-critic "
                                   "policy's)"), "orthogonal" if v else "torch")]
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
    if k in ("use_expln", "full_std"):  # gSDE's: SB3 passes them to the distribution only with use_sde
        return [(sde_field(k, ctx), bool(v))] if ctx.entry.get("use_sde") else []
    raise Refused(f"SB3's policy argument {k!r} has no counterpart in corral")
