"""Ensembles of trained agents (ElegantRL's ensemble methods): a weighted average of the
members' action distributions (policy-gradient family: PPO, A2C, ...) or Q-values (value
family: DQN and its variants), and model fusion, one policy whose parameters are the weighted
average of same-architecture members' (observation normalizer statistics pooled exactly).

An :class:`Ensemble` is an :class:`corral.Agent`: ``act``, ``corral.evaluate`` and ``save``
work on it, and ``corral.load`` reads the file back as an ensemble. ``fuse`` returns an
ordinary agent of the members' algorithm."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from corral import config as C
from corral.actors.normalizer import RunningNormalizer
from corral.agent import CHECKPOINT_KINDS, Agent, build_acting_algo, config_from_dict, evaluate, load
from corral.algos.base import Policy
from corral.errors import UserError

FORMAT_KEY = "ensemble"


def _as_agent(member: Any):
    if isinstance(member, Agent):
        return member
    if isinstance(member, (str, Path)):
        return load(member, device="cpu")
    raise UserError(f"an ensemble member must be an Agent, a run directory or a checkpoint file, got "
                    f"{type(member).__name__}")


def _name(agent, i: int) -> str:
    return f"member {i} ({agent.run_dir or agent.cfg.algo})"


def _kind(agent, i: int) -> str:
    """How a member's votes combine: ``q`` (Q-values), ``probs`` (a categorical policy's
    probabilities) or ``action`` (a continuous policy's deterministic action)."""
    algo = agent.algo
    if algo.recurrent:
        raise UserError(f"{_name(agent, i)}: {agent.cfg.algo} is recurrent; ensembles take feed-forward agents")
    kind = algo.ensemble_vote()
    if kind is not None:
        return kind
    if algo.value_method:
        raise UserError(f"{_name(agent, i)}: {agent.cfg.algo}'s network has no q(obs) to average")
    raise UserError(f"{_name(agent, i)}: ensembles of {agent.cfg.algo} on {algo.act_space} are not supported "
                    "(they average Q-values, categorical policies or continuous actions)")


def weights_from_returns(returns: Sequence[float]) -> list[float]:
    """Weights from members' evaluation returns: ``R_i - min R + d``, normalized, with
    ``d = 0.1 (max R - min R)`` (1 when all are equal), so the worst member keeps a small
    say and equal members get equal weights."""
    lo, hi = min(returns), max(returns)
    d = 0.1 * (hi - lo) if hi > lo else 1.0
    raw = [r - lo + d for r in returns]
    total = sum(raw)
    return [r / total for r in raw]


def _check_weights(weights: Sequence[float], n: int) -> list[float]:
    w = [float(x) for x in weights]
    if len(w) != n:
        raise UserError(f"ensemble weights: {len(w)} given for {n} members; give one per member")
    if any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        raise UserError(f"ensemble weights {w} must be finite, >= 0 and not all 0")
    total = sum(w)
    return [x / total for x in w]


class EnsembleAlgo:
    """The members' algorithms acting as one (what ``Agent`` and ``corral.evaluate`` read:
    ``act``, ``policy``, ``actor``, ``device``, ``value_method``)."""

    recurrent = False

    def __init__(self, algos: list, weights: list[float], kind: str):
        self.algos, self.kind = algos, kind
        self.device = algos[0].device
        self.weights = torch.tensor(weights, dtype=torch.float32, device=self.device)
        self.value_method = kind == "q"
        self.obs_space, self.act_space = algos[0].obs_space, algos[0].act_space
        self.actor = torch.nn.ModuleList([a.actor for a in algos])  # .eval() / .train() reach every member
        self.rng = algos[0].rng

    def scores(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, actions]``: the weighted mean of the members' Q-values or probabilities."""
        w = self.weights
        with torch.no_grad():
            if self.kind == "q":
                parts = [a.actor.q(obs) for a in self.algos]
            else:
                parts = [a.actor.dist_params(a.actor.normalize(obs)).exp() for a in self.algos]
            return torch.einsum("m,mba->ba", w, torch.stack(parts))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if self.kind == "action":
            acts = torch.stack([a.act(obs, deterministic=True) for a in self.algos]).float()
            if deterministic:
                return torch.einsum("m,mb...->b...", self.weights, acts)
            pick = torch.multinomial(self.weights.expand(obs.shape[0], -1), 1, generator=self.rng["action"])[:, 0]
            sampled = torch.stack([a.act(obs, deterministic=False) for a in self.algos]).float()
            return sampled[pick, torch.arange(obs.shape[0], device=obs.device)]
        s = self.scores(obs)
        if deterministic or self.kind == "q":
            return s.argmax(-1)
        return torch.multinomial(s, 1, generator=self.rng["action"])[:, 0]

    def policy(self, deterministic: bool = True) -> Policy:
        return Policy(lambda obs: self.act(obs, deterministic=deterministic))

    def state_dict(self) -> dict:
        return {}


class Ensemble(Agent):
    """A weighted ensemble of trained agents, acting as one agent.

    ``members``: agents, run directories or checkpoint files of one env (feed-forward,
    all value-family or all policy-gradient). ``weights``: one per member, ``"eval"`` (from
    each member's evaluation return, :func:`weights_from_returns`) or None (equal)."""

    def __init__(self, members: Sequence[Any], weights: Sequence[float] | str | None = None,
                 eval_episodes: int = 10, seed: int = 0):
        agents = [_as_agent(m) for m in members]
        if len(agents) < 2:
            raise UserError(f"an ensemble needs at least 2 members, got {len(agents)}")
        kinds = [_kind(a, i) for i, a in enumerate(agents)]
        first = agents[0]
        for i, (a, k) in enumerate(zip(agents, kinds)):
            if a.algo.obs_space != first.algo.obs_space or a.algo.act_space != first.algo.act_space:
                raise UserError(f"{_name(a, i)} acts on {a.algo.obs_space} -> {a.algo.act_space}, member 0 on "
                                f"{first.algo.obs_space} -> {first.algo.act_space}: members must share one env")
            if k != kinds[0]:
                raise UserError(f"{_name(a, i)} votes with {k}, member 0 with {kinds[0]}: an ensemble averages "
                                "one kind (all value-family or all policy-gradient agents)")
            if a.algo.device != first.algo.device:
                a.algo.to(first.algo.device)
        self.member_returns: list[float] | None = None
        if isinstance(weights, str):
            if weights != "eval":
                raise UserError(f"ensemble weights {weights!r}: give numbers, 'eval' or nothing (equal)")
            self.member_returns = [evaluate(a, episodes=eval_episodes, seed=seed)["mean_return"] for a in agents]
            w = weights_from_returns(self.member_returns)
        else:
            w = _check_weights(weights if weights is not None else [1.0] * len(agents), len(agents))
        self.members = agents
        super().__init__(EnsembleAlgo([a.algo for a in agents], w, kinds[0]), first.cfg, None)

    @property
    def weights(self) -> list[float]:
        return self.algo.weights.tolist()

    def fuse(self):
        """One agent with the members' weighted-average parameters (:func:`fuse`)."""
        return fuse(self.members, self.weights)

    def save(self, path: str | Path) -> Path:
        from corral.train.checkpoint import save_checkpoint

        members = [{"config": C.to_dict(a.cfg), "algo": a.algo.state_dict()} for a in self.members]
        return save_checkpoint({"config": C.to_dict(self.cfg), "algo": {},
                                FORMAT_KEY: {"members": members, "weights": self.weights,
                                             "member_returns": self.member_returns}}, path)



def load_ensemble(state: dict, device: torch.device):
    """An :class:`Ensemble` from a checkpoint ``Ensemble.save`` wrote (``corral.load`` calls this)."""
    agents = []
    for m in state[FORMAT_KEY]["members"]:
        cfg = config_from_dict(m["config"])
        algo = build_acting_algo(cfg, device)
        algo.load_state_dict(m["algo"])
        agents.append(Agent(algo, cfg))
    ens = Ensemble(agents, state[FORMAT_KEY]["weights"])
    ens.member_returns = state[FORMAT_KEY].get("member_returns")
    return ens


CHECKPOINT_KINDS[FORMAT_KEY] = load_ensemble  # corral.load reads an ensemble's checkpoint through it


def _normalizer_prefixes(module: torch.nn.Module) -> list[str]:
    return [name + "." if name else "" for name, m in module.named_modules() if isinstance(m, RunningNormalizer)]


def pooled_statistics(counts, means, vars_) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean and (population) variance of the union of the samples behind each
    ``(count, mean, var)``: what one normalizer that had seen all of them would hold. Written
    as member 0 plus weighted differences so identical members give member 0's values exactly."""
    total = sum(counts)
    if float(total) == 0:
        return total, means[0].clone(), vars_[0].clone()
    f = [c / total for c in counts]
    mean = means[0] + sum(fi * (m - means[0]) for fi, m in zip(f, means))
    var = vars_[0] + sum(fi * (v - vars_[0]) for fi, v in zip(f, vars_)) \
        + sum(fi * (m - mean).square() for fi, m in zip(f, means))
    return total, mean, var


def fuse(members: Sequence[Any], weights: Sequence[float] | None = None):
    """Model fusion: an agent of the members' algorithm whose parameters are the weighted
    average of theirs (``x_0 + sum_i w_i (x_i - x_0)``: identical members fuse exactly) and
    whose observation normalizers hold the pooled statistics of all members
    (:func:`pooled_statistics`). Members must share the algorithm and the architecture."""
    agents = [_as_agent(m) for m in members]
    if len(agents) < 2:
        raise UserError(f"fusion needs at least 2 members, got {len(agents)}")
    w = _check_weights(weights if weights is not None else [1.0] * len(agents), len(agents))
    first = agents[0]
    for i, a in enumerate(agents[1:], 1):
        if a.cfg.algo != first.cfg.algo:
            raise UserError(f"fusion averages one algorithm's parameters: {_name(a, i)} is {a.cfg.algo}, "
                            f"member 0 is {first.cfg.algo}")
    algo = copy.deepcopy(first.algo)
    for net_name in algo.networks:
        nets = [getattr(a.algo, net_name) for a in agents]
        states = [n.state_dict() for n in nets]
        ref = states[0]
        for i, s in enumerate(states[1:], 1):
            if s.keys() != ref.keys():
                extra = sorted(set(s) ^ set(ref))[:3]
                raise UserError(f"fusion needs one architecture: {_name(agents[i], i)}'s {net_name} differs from "
                                f"member 0's in its parameters ({', '.join(extra)}); fuse members trained with the "
                                "same network options (hidden, activation, dueling, ...) or use an Ensemble")
            for k, v in ref.items():
                if s[k].shape != v.shape:
                    raise UserError(f"fusion needs one architecture: {_name(agents[i], i)}'s {net_name}.{k} has shape "
                                    f"{tuple(s[k].shape)}, member 0's {tuple(v.shape)}; fuse members with the same "
                                    "network sizes or use an Ensemble")
        fused = {}
        norm_keys = set()
        for p in _normalizer_prefixes(nets[0]):
            if p + "count" not in ref:
                continue
            count, mean, var = pooled_statistics([s[p + "count"] for s in states], [s[p + "mean"] for s in states],
                                                 [s[p + "var"] for s in states])
            fused.update({p + "count": count, p + "mean": mean, p + "var": var})
            norm_keys |= {p + "count", p + "mean", p + "var"}
        for k, v in ref.items():
            if k in norm_keys:
                continue
            if v.is_floating_point():
                fused[k] = v + sum(wi * (s[k] - v) for wi, s in zip(w, states))
            elif any(not torch.equal(s[k], v) for s in states):
                raise UserError(f"fusion: {net_name}.{k} (integer state) differs between members; cannot average it")
            else:
                fused[k] = v.clone()
        getattr(algo, net_name).load_state_dict(fused)
    return Agent(algo, copy.deepcopy(first.cfg), None)

