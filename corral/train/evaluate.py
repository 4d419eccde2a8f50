"""Evaluation: run a policy on separate envs under a stated protocol and report raw env returns.

The protocol (:class:`EvalProtocol`) is what a score means: how actions are chosen (the
policy's mode or a sample, and ``epsilon``, the chance of a uniformly random action, drawn
from its own ``eval_action`` stream), where episodes are cut (``max_episode_steps``), and for
Atari the game settings (sticky actions, frame skip, no-op starts, FIRE, the raw score of
the whole game). Every result carries it. The defaults per family follow the papers people
compare with: Atari value methods act epsilon-greedy with 0.05 (Mnih et al. 2015), episodes
end at 108,000 frames, sticky actions stay at ALE v5's 0.25 (Machado et al. 2018); other
envs act with the policy's mode under their own time limit.

Statistics over the episodes of one evaluation (:func:`summarize`): mean, std, median, min,
max and a 95% percentile-bootstrap interval of the mean (fixed seed); across seeds,
:func:`iqm`, the interquartile mean (Agarwal et al. 2021).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from corral.algos.base import Policy, as_policy
from corral.envs.base import episode_done
from corral.errors import UserError

ATARI_MAX_FRAMES = 108_000  # ALE v5's max_num_frames_per_episode: 30 minutes of play at 60 Hz
ATARI_EVAL_EPSILON = 0.05  # DQN (Nature) evaluation; Rainbow and Dopamine use 0.001


# ---------------------------------------------------------------------------
# The protocol


@dataclass
class EvalProtocol:
    """How an evaluation acts and where its episodes end; ``as_dict()`` goes into every result."""

    family: str
    """``atari``, ``native`` or ``gymnasium`` (any other env)"""
    epsilon: float
    """chance of a uniformly random action at each step (from the ``eval_action`` stream)"""
    deterministic: bool
    """the policy's mode (True) or a sample from it"""
    max_episode_steps: int | None
    """agent steps after which an episode is truncated (None: the env's own limit, unknown here)"""
    episode_cap: str
    """where that cap comes from: ``eval.max_episode_steps``, ``ALE`` or ``env``"""
    max_seconds: float | None = None
    """the evaluation's time budget (None: none)"""
    score: str = "undiscounted env return"
    # Atari only
    max_episode_frames: int | None = None
    frame_skip: int | None = None
    repeat_action_probability: float | None = None
    noop_max: int | None = None
    fire_reset: bool | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if v is not None or k in ("max_episode_steps", "max_seconds")}

    def describe(self) -> str:
        """One line, as ``corral eval`` prints it."""
        acting = ("mode" if self.deterministic else "sampled") + f" actions, epsilon {self.epsilon:g}"
        if self.max_episode_steps is None:
            cap = "episodes end at the env's own limit"
        else:
            cap = f"episodes capped at {self.max_episode_steps:,} steps"
            if self.max_episode_frames is not None:
                cap += f" ({self.max_episode_frames:,} frames)"
            cap += f" [{self.episode_cap}]"
        parts = [self.family, acting, cap]
        if self.family == "atari":
            parts.append(f"sticky actions {self.repeat_action_probability:g}")
            parts.append(f"frame skip {self.frame_skip}, up to {self.noop_max} no-ops"
                         + (", FIRE on reset and after a lost life" if self.fire_reset else ""))
        parts.append(self.score)
        if self.max_seconds is not None:
            parts.append(f"time budget {self.max_seconds:g} s")
        return "; ".join(parts)


def is_value_method(algo: Any) -> bool:
    """Acts greedily on learned action values (the DQN family: ``Algorithm.value_method``)."""
    return bool(algo.value_method)


def _ale_id(spec: Any) -> str | None:
    if not isinstance(spec, str):
        return None
    from corral.envs.atari import is_ale_id, register_ale, resolve_short_name

    try:
        if not register_ale():
            return None
        if is_ale_id(spec):
            return spec
        return resolve_short_name(spec)
    except UserError:
        return None


def resolve_protocol(cfg, algo: Any = None, spec: Any = None, *, epsilon: float | None = None,
                     deterministic: bool | None = None, max_episode_steps: int | None = None,
                     max_seconds: float | None = None) -> EvalProtocol:
    """The protocol of run config ``cfg``'s evaluations (its ``eval`` and ``env`` sections),
    with the keyword arguments, when given, in place of the config's values."""
    ec, env = cfg.eval, cfg.env
    spec = env.id if spec is None else spec
    epsilon = ec.epsilon if epsilon is None else epsilon
    deterministic = ec.deterministic if deterministic is None else deterministic
    cap = ec.max_episode_steps if max_episode_steps is None else max_episode_steps
    max_seconds = ec.max_seconds if max_seconds is None else max_seconds
    if epsilon is not None and not 0 <= epsilon <= 1:
        raise UserError(f"evaluation epsilon {epsilon!r} is out of range; it must be in [0, 1]")
    if cap is not None and cap < 1:
        raise UserError(f"evaluation max_episode_steps {cap!r} is out of range; it must be >= 1")
    if max_seconds is not None and not max_seconds > 0:
        raise UserError(f"evaluation max_seconds {max_seconds!r} is out of range; it must be > 0")
    ale = _ale_id(spec)
    if ale is not None:
        import gymnasium as gym

        registered = gym.spec(ale).kwargs
        if env.atari_wrappers:
            from corral.envs.atari import AtariOptions

            o = AtariOptions()
            frame_skip, noop_max, fire = int(env.kwargs.get("frameskip", o.frame_skip)), o.noop_max, o.fire_reset
        else:
            frame_skip, noop_max, fire = int(env.kwargs.get("frameskip", registered.get("frameskip", 4))), 0, False
        sticky = env.repeat_action_probability
        if sticky is None:
            sticky = env.kwargs.get("repeat_action_probability", registered.get("repeat_action_probability", 0.25))
        max_frames = int(env.kwargs.get("max_num_frames_per_episode",
                                        registered.get("max_num_frames_per_episode", ATARI_MAX_FRAMES)))
        if epsilon is None:
            epsilon = ATARI_EVAL_EPSILON if (algo is not None and is_value_method(algo)) else 0.0
        source = "eval.max_episode_steps" if cap is not None else "ALE"
        if cap is None:
            cap = max_frames // frame_skip
        return EvalProtocol(
            "atari", float(epsilon), bool(deterministic), int(cap), source, max_seconds,
            "raw game score over the whole game (no reward clipping, no episodic life)",
            max_episode_frames=int(cap) * frame_skip, frame_skip=frame_skip,
            repeat_action_probability=float(sticky), noop_max=noop_max, fire_reset=fire)
    family = "native" if isinstance(spec, str) and (spec.startswith("native:") or env.backend == "native") \
        else "gymnasium"
    source = "eval.max_episode_steps" if cap is not None else "env"
    if cap is None:
        cap = _registered_limit(spec)
    return EvalProtocol(family, float(epsilon or 0.0), bool(deterministic), cap, source, max_seconds)


def _registered_limit(spec: Any) -> int | None:
    """The time limit an env id declares (Gymnasium's registry, a native env's class)."""
    if not isinstance(spec, str):
        return None
    if spec.startswith("native:"):
        from corral.envs.native import _CLASSES

        cls = _CLASSES.get(spec.removeprefix("native:"))
        return None if cls is None else int(cls.max_episode_steps)
    import gymnasium as gym

    try:
        return gym.spec(spec.rpartition(":")[2] if ":" in spec else spec).max_episode_steps
    except gym.error.Error:
        return None


# ---------------------------------------------------------------------------
# Acting


def eval_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh generator for an evaluation's epsilon draws: seeded from the ``eval_action``
    stream's seed, so every evaluation of a run draws the same and none moves a training stream."""
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    return g


def epsilon_greedy(act: Callable[[torch.Tensor], torch.Tensor], action_space, epsilon: float,
                   generator: torch.Generator | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``act`` with each env copy's action replaced by a uniformly random one with chance
    ``epsilon`` (a Discrete action space). Each step draws ``[N]`` random actions and ``[N]``
    uniforms from ``generator``, whatever the policy does, so a seed fixes every draw."""
    if not epsilon:
        return act
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Discrete):
        raise UserError(f"eval.epsilon={epsilon:g} needs a Discrete action space (it picks a random action "
                        f"among n), got {action_space}; set eval.epsilon=0")
    if generator is None:
        raise ValueError("epsilon_greedy: epsilon > 0 needs a generator (eval_generator)")
    return _EpsilonGreedy(as_policy(act), int(action_space.n), int(action_space.start), epsilon, generator)


class _EpsilonGreedy(Policy):
    def __init__(self, inner: Policy, n_actions: int, start: int, epsilon: float, generator: torch.Generator):
        self.inner, self.n_actions, self.start, self.epsilon, self.generator = inner, n_actions, start, epsilon, generator

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.inner(obs)  # the policy acts (and moves its state) whether or not it is overridden
        n, g = action.shape[0], self.generator
        random_action = torch.randint(self.n_actions, (n,), generator=g, device=g.device) + self.start
        explore = torch.rand(n, generator=g, device=g.device) < self.epsilon
        return torch.where(explore.to(action.device), random_action.to(action.device, action.dtype), action)

    def episodes_ended(self, ended: torch.Tensor) -> None:
        self.inner.episodes_ended(ended)

    def rewarded(self, reward: torch.Tensor) -> None:
        self.inner.rewarded(reward)


# ---------------------------------------------------------------------------
# Playing


class Played(NamedTuple):
    returns: list[float]
    lengths: list[int]
    at_cap: int  # episodes that ended truncated (an episode cap, not the game)
    timed_out: bool  # stopped at the time budget with fewer episodes than asked for
    seconds: float
    agent_returns: list | None = None  # a multi-agent env's per-agent returns of the same episodes


EpisodeCallback = Callable[[int, int, float, float], None]  # (finished, asked for, running mean, seconds)


def play_episodes(act: Callable[[torch.Tensor], torch.Tensor], env, episodes: int, seed: int | None = None,
                  max_steps: int = 1_000_000, max_seconds: float | None = None,
                  on_episode: EpisodeCallback | None = None) -> Played:
    """Play until ``episodes`` episodes finished, spread evenly over the env's N copies
    (the first ones of each env, so the result does not favour short episodes), or until
    ``max_seconds`` have passed (then the episodes finished so far). ``on_episode`` hears
    each finished episode."""
    t0 = time.perf_counter()
    act = as_policy(act)
    n = env.num_envs
    targets = np.array([(episodes + i) // n for i in range(n)])
    if getattr(env, "device_resident", False) and episodes <= n:
        return _first_episodes_on_device(act, env, torch.as_tensor(targets > 0, device=env.device), seed,
                                         max_seconds=max_seconds, on_episode=on_episode, t0=t0)
    counts = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    at_cap = 0
    timed_out = False
    agent_returns: list | None = None
    obs = env.reset(seed=seed)
    for _ in range(max_steps):
        if (counts >= targets).all():
            break
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            timed_out = True
            break
        obs, reward, term, trunc, info = env.step(act(obs))
        act.rewarded(reward)
        act.episodes_ended(term | trunc)
        done = episode_done(info, term, trunc).cpu().numpy()
        if done.any():
            ep_ret = info["episode_return"].cpu().numpy()
            ep_len = info["episode_length"].cpu().numpy()
            capped = (trunc & ~term).cpu().numpy()
            per_agent = info.get("agent_returns")  # multi-agent envs (corral.envs.multiagent)
            if per_agent is not None:
                per_agent = per_agent.cpu().numpy()
                agent_returns = [] if agent_returns is None else agent_returns
            for i in np.nonzero(done)[0]:
                if counts[i] < targets[i]:
                    if per_agent is not None:
                        agent_returns.append(per_agent[i].tolist())
                    returns.append(float(ep_ret[i]))
                    lengths.append(int(ep_len[i]))
                    at_cap += int(capped[i])
                    counts[i] += 1
                    if on_episode is not None:
                        on_episode(len(returns), episodes, float(np.mean(returns)), time.perf_counter() - t0)
    return Played(returns, lengths, at_cap, timed_out, time.perf_counter() - t0, agent_returns)


def run_episodes(act: Callable[[torch.Tensor], torch.Tensor], env, episodes: int, seed: int | None = None,
                 max_steps: int = 1_000_000) -> list[float]:
    """The returns of :func:`play_episodes` (no time budget)."""
    return play_episodes(act, env, episodes, seed, max_steps).returns


@torch.no_grad()
def _first_episodes_on_device(act, env, wanted: torch.Tensor, seed: int | None, check_every: int = 64,
                              max_seconds: float | None = None, on_episode: EpisodeCallback | None = None,
                              t0: float | None = None) -> Played:
    """The first episode of each ``wanted`` env copy of a device-resident env, stepped with no
    host read but one every ``check_every`` steps (are any still running? the time budget and
    ``on_episode`` are heard there too)."""
    t0 = time.perf_counter() if t0 is None else t0
    act = as_policy(act)
    obs = env.reset(seed=seed)
    alive = wanted.clone()
    returns = torch.zeros(env.num_envs, device=env.device)
    lengths = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
    capped = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
    total = int(wanted.sum())
    timed_out = False
    t = 0
    while True:
        obs, reward, term, trunc, info = env.step(act(obs))
        act.rewarded(reward)
        act.episodes_ended(term | trunc)
        done = episode_done(info, term, trunc) & alive
        returns = torch.where(done, info["episode_return"].to(returns.dtype), returns)
        lengths = torch.where(done, info["episode_length"].to(lengths.dtype), lengths)
        capped |= done & trunc & ~term
        alive &= ~done
        t += 1
        if t % check_every == 0:
            finished = wanted & ~alive
            count, sum_ = torch.stack([finished.sum().to(returns.dtype), returns[finished].sum()]).tolist()
            if on_episode is not None and count:
                on_episode(int(count), total, sum_ / count, time.perf_counter() - t0)
            if count == total:
                break
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                timed_out = True
                break
    finished = wanted & ~alive
    return Played(returns[finished].tolist(), lengths[finished].tolist(), int(capped[finished].sum()), timed_out,
                  time.perf_counter() - t0)


def evaluate_policy(act: Callable[[torch.Tensor], torch.Tensor], env, episodes: int, protocol: EvalProtocol,
                    seed: int | None = None, generator: torch.Generator | None = None,
                    on_episode: EpisodeCallback | None = None) -> dict:
    """Play ``episodes`` episodes under ``protocol`` (``act`` already in its deterministic or
    sampling mode; epsilon is applied here from ``generator``) and return :func:`summarize`'s
    statistics with ``episodes_requested``, ``episodes_at_cap``, ``stopped`` (``"max_seconds"``
    when the time budget ended it early, else None), ``seconds``, ``mean_length`` and ``protocol``."""
    acting = epsilon_greedy(act, env.single_action_space, protocol.epsilon, generator)
    if protocol.max_episode_steps is None:
        limit = getattr(env, "max_episode_steps", None)  # a native env's built-in limit
        if isinstance(limit, int):
            protocol = dataclasses.replace(protocol, max_episode_steps=limit)
    played = play_episodes(acting, env, episodes, seed, max_seconds=protocol.max_seconds, on_episode=on_episode)
    out = summarize(played.returns)
    out.update({
        "episodes_requested": int(episodes),
        "episodes_at_cap": played.at_cap,
        "stopped": "max_seconds" if played.timed_out else None,
        "seconds": round(played.seconds, 3),
        "mean_length": float(np.mean(played.lengths)) if played.lengths else float("nan"),
        "protocol": protocol.as_dict(),
    })
    if played.agent_returns:  # multi-agent: each agent's mean return beside the team's (``mean_return``)
        out["agent_returns"] = np.mean(played.agent_returns, axis=0).tolist()
    return out


@torch.no_grad()
def evaluate_native(actor, env_id: str, episodes: int = 50, seed: int = 0, device=None, epsilon: float = 0.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns (float64 ``[episodes]``) of one episode per copy of a native env, on the
    actor's device, with the policy's mode, epsilon-greedy when ``epsilon`` > 0 (Discrete
    actions; ``generator``, default: one seeded from the ``eval_action`` stream of ``seed``).
    Episodes end at the env's built-in limit."""
    from corral.envs.native import make_native
    from corral.rng import RNGStreams

    device = device or next(actor.parameters()).device
    env = make_native(env_id, episodes, device=device, seed=seed)
    if epsilon and generator is None:
        generator = eval_generator(RNGStreams(seed).seeds["eval_action"], device)
    acting = epsilon_greedy(lambda o: actor.act(o, deterministic=True), env.single_action_space, epsilon, generator)
    was_training = actor.training
    actor.eval()
    try:
        played = _first_episodes_on_device(acting, env, torch.ones(episodes, dtype=torch.bool, device=device), seed)
    finally:
        actor.train(was_training)
    return torch.tensor(played.returns, dtype=torch.float64, device=device)


# ---------------------------------------------------------------------------
# Statistics


def bootstrap_ci(values, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: ``resamples`` resamples with replacement
    (``numpy.random.default_rng(seed)``, so the same values give the same interval), the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of their means."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, arr.size, size=(resamples, arr.size))
    means = arr[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def iqm(values) -> float:
    """Interquartile mean (Agarwal et al. 2021, rliable): the mean of what is left after the
    lowest and the highest quarter (``floor(n / 4)`` values each) are dropped; for the scores
    of a few seeds, steadier than the mean and less wasteful than the median. The same as
    ``scipy.stats.trim_mean(values, 0.25)``."""
    arr = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if arr.size == 0:
        return float("nan")
    k = int(arr.size * 0.25)
    return float(arr[k:arr.size - k].mean())


def summarize_seeds(per_seed: dict | list) -> dict:
    """Across seeds: the IQM of each seed's figure (say its mean eval return), beside the
    figures themselves (``per_seed``, a ``{seed: value}`` or a list) and their median."""
    values = list(per_seed.values()) if isinstance(per_seed, dict) else list(per_seed)
    arr = np.asarray(values, dtype=np.float64)
    return {"iqm": iqm(arr), "median": float(np.median(arr)) if arr.size else float("nan"),
            "seeds": int(arr.size), "per_seed": per_seed if isinstance(per_seed, dict) else values}


def summarize(returns: list[float]) -> dict:
    """Mean, std (of the episodes, not of the mean), median, min, max and the 95% bootstrap
    interval of the mean (:func:`bootstrap_ci`, seed 0) of one evaluation's returns."""
    arr = np.asarray(returns, dtype=np.float64)
    nan = float("nan")
    lo, hi = bootstrap_ci(arr)
    return {
        "mean_return": float(arr.mean()) if arr.size else nan,
        "std_return": float(arr.std()) if arr.size else nan,
        "median_return": float(np.median(arr)) if arr.size else nan,
        "min_return": float(arr.min()) if arr.size else nan,
        "max_return": float(arr.max()) if arr.size else nan,
        "ci95_return": [lo, hi],
        "episodes": int(arr.size),
    }


def describe_result(result: dict) -> str:
    """An ``evaluate`` result's protocol in one line, with how the evaluation ended (``corral eval``)."""
    text = EvalProtocol(**result["protocol"]).describe()
    if result.get("stopped") == "max_seconds":
        text += (f"; stopped at the time budget after {result['episodes']} of {result['episodes_requested']} "
                 "episodes (the statistics are theirs)")
    if result.get("episodes_at_cap"):
        text += f"; {result['episodes_at_cap']} episodes reached the cap"
    return text
