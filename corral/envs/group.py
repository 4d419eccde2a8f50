"""Stepping a slice of a vector env's Gymnasium envs: the one loop every host backend runs.

``SyncVecEnv`` runs one :class:`EnvGroup` over all its envs; ``SubprocVecEnv`` runs one
per worker process over a slice. Same-step autoreset, final observations, episode
statistics, restarts after a crash and env state capture all live here, so the
backends agree by construction. It works in numpy and Python values only; the front
end (:class:`corral.envs.vector.HostVecEnv`) makes the torch tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from corral.envs.spaces import flatten_parts
from corral.envs.base import EnvError

# Env modules whose whole state is plain attributes (arrays, numbers, RNGs), so a
# checkpoint can hold it and a resumed run continues the same episodes.
_COPYABLE_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text")

# A wrapper that reports whole episodes itself (e.g. the raw Atari score under reward
# clipping and episodic life) sets ``corral_reports_episodes = True`` and puts the
# episode's return under this info key on the step that ends the whole episode.
EPISODE_KEY = "corral_episode"


def is_copyable(env: gym.Env) -> bool:
    unwrapped = env.unwrapped
    return bool(getattr(unwrapped, "corral_copyable", False)) or type(unwrapped).__module__.startswith(_COPYABLE_MODULES)


def reports_episodes(env: gym.Env) -> bool:
    """True when a wrapper of ``env`` reports whole episodes under ``EPISODE_KEY``."""
    return any(getattr(layer, "corral_reports_episodes", False) for layer in layers(env))


def layers(env: gym.Env) -> list[Any]:
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


def plain_state(obj: Any) -> dict[str, Any]:
    """Attributes of one env layer that a weights-only checkpoint can hold (numpy form)."""
    out: dict[str, Any] = {}
    for k, v in vars(obj).items():
        if isinstance(v, (bool, int, float, str, type(None))):
            out[k] = v
        elif isinstance(v, np.ndarray):
            out[k] = {"__ndarray__": np.array(v)}
        elif isinstance(v, np.generic):
            out[k] = {"__npscalar__": v.item(), "dtype": str(v.dtype)}
        elif isinstance(v, np.random.Generator):
            out[k] = {"__rng__": v.bit_generator.state}
        elif isinstance(v, tuple) and all(isinstance(x, (int, float, bool)) for x in v):
            out[k] = {"__tuple__": list(v)}
    return out


def restore_plain_state(obj: Any, state: dict[str, Any]) -> None:
    for k, v in state.items():
        if isinstance(v, dict) and "__ndarray__" in v:
            v = np.array(v["__ndarray__"])
        elif isinstance(v, dict) and "__npscalar__" in v:
            v = np.array(v["__npscalar__"], dtype=v["dtype"])[()]
        elif isinstance(v, dict) and "__rng__" in v:
            rng = getattr(obj, k, None)
            if not isinstance(rng, np.random.Generator):
                rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = v["__rng__"]
            v = rng
        elif isinstance(v, dict) and "__tuple__" in v:
            v = tuple(v["__tuple__"])
        setattr(obj, k, v)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class EnvGroup:
    """Envs ``offset .. offset + len(factories)`` of a vector env named ``env_id``.

    ``step`` returns plain Python lists (one entry per env) plus the finished episodes;
    the caller turns them into arrays. ``on_error="restart"`` rebuilds an env that
    raised from its factory, reports the broken step as truncated (final observation:
    the last one it returned) and does not report the broken episode.
    """

    def __init__(
        self,
        factories: Sequence[Callable[[], gym.Env]],
        env_id: str = "env",
        offset: int = 0,
        on_error: str = "raise",
        max_restarts: int = 100,
    ):
        if on_error not in ("raise", "restart"):
            raise ValueError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
        self.factories = list(factories)
        self.env_id = env_id
        self.offset = offset
        self.on_error = on_error
        self.max_restarts = max_restarts
        self.envs = [flatten_parts(f()) for f in self.factories]
        n = len(self.envs)
        self.external = [reports_episodes(e) for e in self.envs]
        self.ep_ret = np.zeros(n, dtype=np.float64)  # running return and length of each env's episode
        self.ep_len = np.zeros(n, dtype=np.int64)
        self.last_obs: list[Any] = [None] * n  # what each env returned last (final obs of a broken episode)
        self.restarts = 0
        self.env_restarts = [0] * n
        self._broken: dict[int, Any] = {}  # env index -> last obs of an episode dropped this step
        self.messages: list[str] = []  # restart notices, for the front end to warn with
        self.seed: int | None = None

    @property
    def copyable(self) -> bool:
        return all(is_copyable(e) for e in self.envs)

    def _where(self, i: int) -> str:
        return f"env {self.env_id!r} (index {self.offset + i})"

    def reset(self, seed: int | None = None) -> list[Any]:
        self.seed = seed
        obs = []
        for i, env in enumerate(self.envs):
            try:
                o, _ = env.reset(seed=None if seed is None else seed + self.offset + i)
            except Exception as e:
                raise EnvError(f"{self._where(i)} raised in reset: {_describe(e)}") from e
            obs.append(o)
        self.ep_ret[:] = 0.0
        self.ep_len[:] = 0
        self.last_obs = obs
        self._broken.clear()
        return obs

    def step(self, actions: Any, step: int):
        """One step of every env with ``actions[i]``; autoreset where an episode ended.

        Returns ``(obs, finals, rewards, terminated, truncated, episodes)``: sequences of
        per-env values, ``finals`` a dict {i: final obs} of the envs that ended, and
        ``episodes`` a list of ``(i, return, length)`` of whole episodes that ended.
        """
        # The plain loop first, as lean as a hand-written one; the rare cases after it.
        results = []
        append = results.append
        try:
            for env, a in zip(self.envs, actions):
                append(env.step(a))
        except Exception as e:
            self._step_rest(results, actions, e, step)
        obs, rew, term, trunc, infos = zip(*results)
        self.ep_ret += rew
        self.ep_len += 1
        finals: dict[int, Any] = {}
        episodes: list[tuple[int, float, int]] = []
        if True in term or True in trunc or self._broken:
            obs = list(obs)
            for i in range(len(obs)):
                if term[i] or trunc[i]:
                    self._end_episode(i, obs, infos[i], finals, episodes, step)
            self._broken.clear()
        self.last_obs = obs
        return obs, finals, rew, term, trunc, episodes

    def _step_rest(self, results: list, actions: Any, err: Exception, step: int) -> None:
        """Env ``len(results)`` raised: raise, or restart it and step the rest."""
        while True:
            i = len(results)
            if self.on_error != "restart":
                raise EnvError(f"{self._where(i)} raised at vector step {step}: {_describe(err)}") from err
            o = self._restart(i, err, step)
            self._broken[i] = self.last_obs[i]
            results.append((o, 0.0, False, True, {}))
            try:
                for env, a in zip(self.envs[i + 1:], actions[i + 1:]):
                    results.append(env.step(a))
                return
            except Exception as e:
                err = e

    def _end_episode(self, i: int, obs: list, info: dict, finals: dict, episodes: list, step: int) -> None:
        if i in self._broken:  # restarted: the broken episode is not reported; its last obs is the final one
            finals[i] = self._broken[i]
            self.ep_ret[i], self.ep_len[i] = 0.0, 0
            return
        finals[i] = obs[i]
        if self.external[i]:
            # The wrapper's raw score; the length counts this env's steps over the whole episode.
            raw = info.get(EPISODE_KEY)
            if raw is not None:  # (None: a life lost, not the game: the episode goes on)
                episodes.append((i, float(raw), int(self.ep_len[i])))
                self.ep_ret[i], self.ep_len[i] = 0.0, 0
        else:
            episodes.append((i, float(self.ep_ret[i]), int(self.ep_len[i])))
            self.ep_ret[i], self.ep_len[i] = 0.0, 0
        try:
            obs[i], _ = self.envs[i].reset()
        except Exception as e:
            if self.on_error != "restart":
                raise EnvError(f"{self._where(i)} raised in reset at vector step {step}: {_describe(e)}") from e
            obs[i] = self._restart(i, e, step)

    def _restart(self, i: int, err: Exception, step: int):
        """Rebuild env ``i`` after it raised; the broken step reads as a truncation."""
        self.restarts += 1
        self.env_restarts[i] += 1
        where = self._where(i)
        if self.env_restarts[i] > self.max_restarts:
            raise EnvError(
                f"{where} raised at vector step {step}: {_describe(err)}; giving up after "
                f"{self.max_restarts} restarts of this env (raise max_restarts, or fix the env)"
            ) from err
        try:
            self.envs[i].close()
        except Exception:  # a broken env may not close cleanly; it is dropped either way
            pass
        try:
            env = flatten_parts(self.factories[i]())
            seed = None
            if self.seed is not None:  # deterministic, and distinct from every other env's seed
                seed = int(np.random.SeedSequence([self.seed, self.offset + i, self.env_restarts[i]]).generate_state(1)[0])
            o, _ = env.reset(seed=seed)
        except Exception as e:
            raise EnvError(f"{where} raised at vector step {step} ({_describe(err)}), and rebuilding it failed: {_describe(e)}") from e
        self.envs[i] = env
        self.ep_ret[i] = 0.0
        self.ep_len[i] = 0
        self.messages.append(
            f"{where} raised at vector step {step}: {_describe(err)}; rebuilt it from its factory, "
            f"dropped the unfinished episode (restart {self.env_restarts[i]} of this env)"
        )
        return o

    # --- state
    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"ep_ret": self.ep_ret.copy(), "ep_len": self.ep_len.copy()}
        if self.copyable:
            state["envs"] = [[plain_state(layer) for layer in layers(env)] for env in self.envs]
        return state

    def set_state(self, state: dict[str, Any]) -> bool:
        """Restore env internals; False (and nothing changed) when they do not fit."""
        env_states = state.get("envs")
        if env_states is None or not self.copyable or len(env_states) != len(self.envs):
            return False
        if any(len(layers(env)) != len(ls) for env, ls in zip(self.envs, env_states)):
            return False
        for env, layer_states in zip(self.envs, env_states):
            for layer, ls in zip(layers(env), layer_states):
                restore_plain_state(layer, ls)
        self.ep_ret[:] = state["ep_ret"]
        self.ep_len[:] = state["ep_len"]
        return True

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception as e:  # closing must not hide the error that brought us here
                warnings.warn(f"env {self.env_id!r}: close() raised {_describe(e)}", stacklevel=2)
