"""Keys from other libraries (Stable-Baselines3, RLlib) and corral's names for them.

:mod:`corral.config` resolves a key it does not know through ``resolve_alias`` and, where
nothing matches, words the error with ``_unknown_key_message`` (nearest valid keys, or what to
set instead of a key corral has no counterpart for). Kept apart from the schema and its checks.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

# Stable-Baselines3 / RLlib key -> corral's. A string holds for every algorithm: a field
# name (resolved like a bare --set key) or a dotted path. A dict picks by the algorithm's
# Config class, the most specific one in its MRO that it lists; None there means corral has
# no single key for it, and ALIAS_NOTES says what to set instead. Keys SB3 and corral
# share (n_steps, n_epochs, ent_coef, vf_coef, gae_lambda, clip_range, buffer_size,
# exploration_final_eps, ...) need no entry. docs/config.md has this table for users.
_PPO = "SurrogateConfig"  # PPO's options that IMPALA's config shares (corral/algos/ppo.py)
_REPLAY = "OffPolicyConfig"
_PG = "PolicyGradientConfig"  # A2C's and REINFORCE's
ALIASES: dict[str, str | dict[str, str | None]] = {
    "learning_rate": "lr",
    "grad_clip": "max_grad_norm",
    "total_timesteps": "steps",
    "n_envs": "env.num_envs",
    "num_envs_per_env_runner": "env.num_envs",
    "num_envs_per_worker": "env.num_envs",
    "num_env_runners": "scheme.collectors",
    "num_rollout_workers": "scheme.collectors",
    "num_workers": "scheme.collectors",
    "net_arch": "hidden",
    "fcnet_hiddens": "hidden",
    "fcnet_activation": "activation",
    "num_sgd_iter": {_PPO: "n_epochs"},
    "num_epochs": {_PPO: "n_epochs"},
    "sgd_minibatch_size": {_PPO: "batch_size"},
    "minibatch_size": {_PPO: "batch_size"},
    "lambda": {_PPO: "gae_lambda", "A2CConfig": "gae_lambda", "IMPALAConfig": None},  # V-trace: no lambda option
    "lambda_": {_PPO: "gae_lambda", "A2CConfig": "gae_lambda", "IMPALAConfig": None},
    "clip_param": {_PPO: "clip_range"},
    "vf_clip_param": {_PPO: "clip_range_vf", "IMPALAConfig": None},  # IMPALA's value loss is not clipped
    "entropy_coeff": {_PPO: "ent_coef", _PG: "ent_coef"},
    "vf_loss_coeff": {_PPO: "vf_coef", _PG: "vf_coef"},
    "kl_target": {_PPO: None},
    "vtrace_clip_rho_threshold": {"IMPALAConfig": "rho_bar"},
    "rms_prop_eps": {_PG: "eps"},  # SB3's A2C (its use_rms_prop is a2c.optimizer)
    "rollout_fragment_length": {_PPO: "n_steps", "A2CConfig": "n_steps", "ApexDQNConfig": "rollout_fragment",
                                "ApexTD3Config": "rollout_fragment", _REPLAY: None},
    "train_batch_size": {_PPO: None, _REPLAY: "batch_size"},
    "target_network_update_freq": {_REPLAY: "target_update_interval"},
    "num_steps_sampled_before_learning_starts": {_REPLAY: "learning_starts"},
    "double_q": {"DQNConfig": "double"},
    "initial_epsilon": {"DQNConfig": "exploration_initial_eps"},
    "final_epsilon": {"DQNConfig": "exploration_final_eps"},
    "target_policy_noise": {"TD3Config": "target_noise"},
}
ALIAS_NOTES = {
    "train_batch_size": "RLlib's train_batch_size is the rollout size; corral's is n_steps * env.num_envs "
                        "(per collector): set n_steps",
    "kl_target": "RLlib's kl_target steers an adaptive KL penalty, which corral does not have; the nearest is "
                 "target_kl (stop an update's epochs early)",
    "rollout_fragment_length": "replay algorithms other than Ape-X send every step to the replay: "
                               "the fragment length is not a setting",
}


def resolve_alias(name: str, algo_cfg: Any) -> str | None:
    """corral's key for another library's ``name`` under this algorithm config, or None."""
    entry = ALIASES.get(name)
    if not isinstance(entry, dict):
        return entry
    for cls in type(algo_cfg).__mro__:
        if cls.__name__ in entry:
            return entry[cls.__name__]
    return None


def _alias_note(given: str, key: str) -> None:
    print(f"corral: note: {given!r} is {key!r} in corral", file=sys.stderr)


def _unknown_key_message(key: str, valid: list[str], algo_cfg: Any = None) -> str:
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ALIASES and resolve_alias(leaf, algo_cfg) is None:
        note = ALIAS_NOTES.get(leaf, f"{leaf!r} is another library's name with no counterpart here")
        return f"unknown config key {key!r}: {note}; `corral list --options ALGO` shows every key"

    def score(k: str) -> float:
        # The whole key, or only its last part ("lr" vs "ppo.lr")
        return max(difflib.SequenceMatcher(None, key, k).ratio(),
                   difflib.SequenceMatcher(None, leaf, k.rsplit(".", 1)[-1]).ratio())

    scored = {k: score(k) for k in valid}
    for alias in difflib.get_close_matches(leaf, list(ALIASES), n=3, cutoff=0.75):  # a misspelt alias
        target = resolve_alias(alias, algo_cfg)
        for k in valid:
            if target and (k == target or k.endswith("." + target)):
                scored[k] = max(scored[k], difflib.SequenceMatcher(None, leaf, alias).ratio())
    close = [k for k in sorted(scored, key=scored.__getitem__, reverse=True) if scored[k] >= 0.6][:3]
    hint = f"; nearest valid keys: {', '.join(close)}" if close else "; `corral list --options ALGO` shows every key"
    return f"unknown config key {key!r}{hint}"
