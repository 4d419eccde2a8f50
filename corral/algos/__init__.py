"""Algorithm registry: a name maps to an Algorithm class plus config overrides, so a
variant (e.g. ``double_dqn``) is a preset of one readable algorithm, not a copy."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

from corral.algos.a2c import A2C, A2CConfig
from corral.algos.apex import ApexDQN, ApexRainbow, ApexTD3
from corral.algos.ars import ARS
from corral.algos.base import Algorithm
from corral.algos.crossq import CrossQ
from corral.algos.distributional import C51, IQN, QRDQN, RAINBOW_OVERRIDES
from corral.algos.dqn import DQN, DQNConfig
from corral.algos.impala import IMPALA
from corral.algos.maddpg import MADDPG, MATD3_OVERRIDES
from corral.algos.mappo import MAPPO
from corral.algos.mdqn import MunchausenDQN
from corral.algos.ngu import NGU, Agent57
from corral.algos.ppo import PPO, PPOConfig
from corral.algos.ppo_icm import PPOICM
from corral.algos.ppo_rnd import PPORND
from corral.algos.qmix import QMIX, qmix_variant
from corral.algos.r2d2 import DRQN_OVERRIDES, R2D2
from corral.algos.recurrent_ppo import RecurrentIMPALA, RecurrentPPO
from corral.algos.redq import DROQ_OVERRIDES, REDQ
from corral.algos.reinforce import REINFORCE, REINFORCEConfig
from corral.algos.sac import SAC, SACConfig
from corral.algos.sac_discrete import SACDiscrete, SACDiscreteConfig
from corral.algos.td3 import DDPG_OVERRIDES, TD3, TD3Config
from corral.algos.tqc import TQC
from corral.algos.trpo import TRPO
from corral.config import ALGO_FAMILIES
from corral.errors import UserError


@dataclass
class AlgoSpec:
    cls: type[Algorithm]
    overrides: dict[str, Any] = field(default_factory=dict)
    help: str = ""
    # the class a config builds where an option picks another implementation under the same name
    # (qmix.recurrent: RecurrentQMIX); None: always ``cls``
    variant: Callable[[Any], type[Algorithm]] | None = None

    def class_for(self, algo_cfg: Any) -> type[Algorithm]:
        """The class to build for ``algo_cfg``."""
        return self.variant(algo_cfg) if self.variant is not None else self.cls


ALGOS: dict[str, AlgoSpec] = {
    "ppo": AlgoSpec(PPO, help="Proximal Policy Optimization (discrete and continuous)"),
    "a2c": AlgoSpec(A2C, help="A2C: synchronous advantage actor-critic, n-step returns or GAE, RMSprop "
                    "(discrete and continuous)"),
    "reinforce": AlgoSpec(REINFORCE, help="REINFORCE: Monte-Carlo policy gradient over whole episodes, optional "
                          "learned baseline (discrete and continuous)"),
    "trpo": AlgoSpec(TRPO, help="TRPO: natural-gradient policy step by conjugate gradient on the KL-constrained "
                     "surrogate, backtracking line search, value fitted by Adam (discrete and continuous)"),
    "ppo_lstm": AlgoSpec(RecurrentPPO, help="PPO with a recurrent (LSTM, or GRU: ppo_lstm.recurrent=gru) "
                         "actor-critic, trained on stored sequences"),
    "ppo_rnd": AlgoSpec(PPORND, help="PPO with Random Network Distillation: intrinsic reward from a predictor "
                        "chasing a fixed random network, two value heads, non-episodic intrinsic returns"),
    "ppo_icm": AlgoSpec(PPOICM, help="PPO with the Intrinsic Curiosity Module: curiosity reward from a forward "
                        "model's error in an inverse-model feature space, PPO-RND's two value heads"),
    "ars": AlgoSpec(ARS, help="ARS: augmented random search of a linear (or small MLP) policy, antithetic "
                    "perturbations scored on the env columns in parallel, top-b directions, V2 observation "
                    "normalization (discrete and continuous)"),
    "dqn": AlgoSpec(DQN, help="Deep Q-Network (discrete)"),
    "double_dqn": AlgoSpec(DQN, {"double": True}, "Double DQN"),
    "dueling_dqn": AlgoSpec(DQN, {"dueling": True}, "Dueling DQN"),
    "d3qn": AlgoSpec(DQN, {"double": True, "dueling": True}, "Dueling Double DQN"),
    "per_dqn": AlgoSpec(DQN, {"prioritized": True}, "DQN with prioritized replay"),
    "per_double_dqn": AlgoSpec(DQN, {"double": True, "prioritized": True}, "Double DQN with prioritized replay"),
    "per_d3qn": AlgoSpec(DQN, {"double": True, "dueling": True, "prioritized": True},
                         "Dueling Double DQN with prioritized replay"),
    "noisy_dqn": AlgoSpec(DQN, {"noisy": True}, "DQN with noisy nets (no epsilon)"),
    "c51": AlgoSpec(C51, help="C51: categorical distributional DQN (discrete)"),
    "qrdqn": AlgoSpec(QRDQN, help="QR-DQN: quantile regression distributional DQN (discrete)"),
    "iqn": AlgoSpec(IQN, help="IQN: implicit quantile networks (discrete)"),
    "rainbow": AlgoSpec(C51, RAINBOW_OVERRIDES, "Rainbow: C51 + double + dueling + PER + n-step + noisy nets"),
    "mdqn": AlgoSpec(MunchausenDQN, help="Munchausen DQN: log-policy bonus and soft backup (discrete)"),
    "r2d2": AlgoSpec(R2D2, help="R2D2: recurrent Q-learning from prioritized sequence replay, stored states, "
                     "burn-in, value rescaling, n-step double Q (discrete)"),
    "ngu": AlgoSpec(NGU, help="NGU: R2D2 with episodic kNN novelty x RND life-long novelty, a family of "
                    "(beta_j, gamma_j) mixtures, conditioned on j and the previous action and rewards (discrete)"),
    "agent57": AlgoSpec(Agent57, help="Agent57: NGU with separate extrinsic and intrinsic Q-networks and a "
                        "sliding-window UCB bandit over the mixtures per collector (discrete)"),
    "drqn": AlgoSpec(R2D2, DRQN_OVERRIDES, "DRQN: recurrent Q-learning from sequences started at zero state"),
    "ddpg": AlgoSpec(TD3, DDPG_OVERRIDES, "DDPG (continuous)"),
    "td3": AlgoSpec(TD3, help="Twin Delayed DDPG (continuous)"),
    "sac": AlgoSpec(SAC, help="Soft Actor-Critic with automatic entropy tuning (continuous)"),
    "redq": AlgoSpec(REDQ, help="REDQ: SAC with an ensemble of N critics, a random subset of M in the target min, "
                     "high update-to-data ratio (continuous)"),
    "droq": AlgoSpec(REDQ, DROQ_OVERRIDES, "DroQ: REDQ's high update ratio with two dropout + layer-norm critics "
                     "(continuous)"),
    "tqc": AlgoSpec(TQC, help="TQC: SAC with quantile critics, the pooled target's top quantiles dropped (continuous)"),
    "crossq": AlgoSpec(CrossQ, help="CrossQ: SAC with batch-renorm critics and actor, no target networks (continuous)"),
    "sac_discrete": AlgoSpec(SACDiscrete, help="Soft Actor-Critic for discrete actions: categorical policy, "
                             "exact expectations over actions, twin Q(s, .) critics"),
    "impala": AlgoSpec(IMPALA, help="IMPALA: actor-critic with V-trace correction (asynchronous collectors)"),
    "impala_lstm": AlgoSpec(RecurrentIMPALA, help="IMPALA with a recurrent (LSTM or GRU) actor-critic"),
    "appo": AlgoSpec(IMPALA, {"surrogate": True, "n_epochs": 4}, "APPO: IMPALA with PPO's clipped surrogate"),
    "apex_dqn": AlgoSpec(ApexDQN, help="Ape-X DQN: distributed prioritized replay, epsilon ladder (discrete)"),
    "apex_rainbow": AlgoSpec(ApexRainbow, help="Ape-X over C51: distributed PER, double, dueling, 3-step (discrete)"),
    "apex_ddpg": AlgoSpec(ApexTD3, DDPG_OVERRIDES, "Ape-X DDPG: distributed prioritized replay, noise ladder"),
    "apex_td3": AlgoSpec(ApexTD3, help="Ape-X over TD3 (twin critics, delayed actor, target smoothing)"),
    "mappo": AlgoSpec(MAPPO, help="MAPPO: multi-agent PPO, shared actor-critic with agent ids, centralised value "
                      "on the global state, value normalization (PettingZoo / MPE envs)"),
    "ippo": AlgoSpec(MAPPO, {"centralized_value": False}, "IPPO: independent PPO, shared actor-critic with agent "
                     "ids, each agent's value on its own observation (PettingZoo / MPE envs)"),
    "qmix": AlgoSpec(QMIX, help="QMIX: per-agent Q mixed monotonically by hypernetworks of the global state, "
                     "double-Q targets (PettingZoo / MPE envs, discrete)", variant=qmix_variant),
    "vdn": AlgoSpec(QMIX, {"mixer": "vdn"}, "VDN: per-agent Q summed into the team's value (PettingZoo / MPE envs, "
                    "discrete)", variant=qmix_variant),
    "maddpg": AlgoSpec(MADDPG, help="MADDPG: decentralised deterministic actors, a centralised critic on the state and "
                       "all agents' actions; Gumbel-softmax for discrete actions (PettingZoo / MPE envs)"),
    "matd3": AlgoSpec(MADDPG, MATD3_OVERRIDES, "MATD3: MADDPG with twin centralised critics (min target), target "
                      "smoothing and delayed actor updates (PettingZoo / MPE envs)"),
}


def family_names(cls: type) -> set[str]:
    """The ``name`` of every Algorithm class ``cls`` is built on."""
    return {k.__dict__["name"] for k in cls.__mro__ if "name" in k.__dict__}


def register_algo(name: str, cls: type[Algorithm], overrides: dict | None = None, help: str = "") -> None:
    ALGOS[name] = AlgoSpec(cls, dict(overrides or {}), help)
    ALGO_FAMILIES[name] = family_names(cls)


ALGO_FAMILIES.update({name: family_names(spec.cls) for name, spec in ALGOS.items()})


def get_algo(name: str) -> AlgoSpec:
    try:
        return ALGOS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(ALGOS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(sorted(ALGOS))}"
        raise UserError(f"unknown algorithm {name!r}{hint}") from None


__all__ = ["A2C", "A2CConfig", "ALGOS", "AlgoSpec", "Algorithm", "REINFORCE", "REINFORCEConfig", "DQN", "DQNConfig", "PPO", "PPOConfig", "SAC", "SACConfig", "SACDiscrete",
           "SACDiscreteConfig", "TD3", "TD3Config", "get_algo", "register_algo"]
