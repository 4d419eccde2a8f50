"""Stepping a slice of a vector env's Gymnasium envs: the one loop every host backend runs.

``SyncVecEnv`` runs one :class:`EnvGroup` over all its envs; ``SubprocVecEnv`` runs one
per worker process over a slice. Same-step autoreset, final observations, episode
statistics, restarts after a crash and env state capture all live here, so the
backends agree by construction. It works in numpy and Python values only, writing into
arrays its caller owns; the front end (:class:`corral.envs.host.HostVecEnv`) makes the
torch tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from corral.envs.base import EnvError
from corral.envs.spaces import flatten_parts

# Env modules whose whole state is plain attributes (arrays, numbers, RNGs), so a
# checkpoint can hold it and a resumed run continues the same episodes.
_COPYABLE_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text")

# A wrapper that reports whole episodes itself (e.g. the raw Atari score under reward
# clipping and episodic life) sets ``corral_reports_episodes = True`` and puts the
# episode's return under this info key on the step that ends the whole episode.
EPISODE_KEY = "corral_episode"


def obs_dtype(space: gym.Space) -> np.dtype:
    """The dtype of a batch of observations from ``space``: float32 for any float space
    (MuJoCo's float64 included), the space's own dtype otherwise."""
    dtype = np.dtype(space.dtype)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


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
        if isinstance(v, np.generic):  # first: np.float64 is also a Python float
            out[k] = {"__npscalar__": v.item(), "dtype": str(v.dtype)}
        elif isinstance(v, (bool, int, float, str, type(None))):
            out[k] = v
        elif isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
            out[k] = {"__ndarray__": np.array(v)}
        # arrays of strings or objects (FrozenLake's map) are what the env was built with, not
        # state it changes: the checkpoint stays numeric and the env keeps its own
        elif isinstance(v, np.random.Generator):
            out[k] = {"__rng__": v.bit_generator.state}
        elif isinstance(v, tuple) and all(isinstance(x, (int, float, bool)) for x in v):
            # as Python numbers (MountainCar's state is a tuple of np.float64, which a weights-only load refuses)
            out[k] = {"__tuple__": [x.item() if isinstance(x, np.generic) else x for x in v]}
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


# What EnvGroup.step reports for an env whose step ended an episode (or a life, or which
# crashed): (index in the group, terminated, truncated, final observation, episode), the
# final observation being the true last one (of a crashed env: the last one it returned),
# and episode the (return, length) of a whole episode that ended there, or None. A plain
# tuple: in CartPole-sized envs a third of all steps end some episode.
Ended = tuple[int, bool, bool, Any, "tuple[float, int] | None"]


class EnvGroup:
    """Envs ``offset .. offset + len(factories)`` of a vector env named ``env_id``.

    ``step`` writes observations and rewards into the caller's arrays and reports the
    few envs that ended an episode. ``on_error="restart"`` rebuilds an env that raised
    from its factory, reports the broken step as truncated (final observation: the last
    one it returned) and does not report the broken episode.
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
        space = self.envs[0].observation_space
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = obs_dtype(space)
        self._batch_shape = (len(self.envs), *self.obs_shape)
        self.external = [reports_episodes(e) for e in self.envs]
        # Running episode statistics: the return (float64 sum of the float32 rewards handed
        # out) and the step count at each episode's start, so lengths cost nothing per step.
        self.ep_ret = np.zeros(n, dtype=np.float64)
        self.t = 0
        self.ep_start = [0] * n
        self.last_obs: list[Any] = [None] * n  # what each env returned last (final obs of a broken episode)
        self.restarts = 0
        self.env_restarts = [0] * n
        self.messages: list[str] = []  # restart notices, for the front end to warn with
        self.seed: int | None = None

    @property
    def copyable(self) -> bool:
        return all(is_copyable(e) for e in self.envs)

    @property
    def ep_len(self) -> np.ndarray:
        return np.array([self.t - s for s in self.ep_start], dtype=np.int64)

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
        self.ep_start = [self.t] * len(self.envs)
        self.last_obs = obs
        return obs

    def step(self, actions: Any, step: int) -> tuple[np.ndarray, np.ndarray, list[Ended]]:
        """One step of every env with ``actions[i]``; autoreset where an episode ended.

        Returns the observations (the next episode's first where one ended; ``[n,
        *obs_shape]`` of ``obs_dtype``), the rewards (float32 ``[n]``), both fresh arrays,
        and the envs whose step ended an episode, a life or a crashed env: an empty list
        in most steps. ``step`` is the vector step, for messages.
        """
        obs_list: list[Any] = []
        rews: list[Any] = []
        ended: list[tuple] = []
        try:
            self._step_envs(0, actions, obs_list, rews, ended, step)
        except EnvError:
            raise
        except Exception as e:
            self._step_rest(actions, obs_list, rews, ended, e, step)
        obs = self._stack(obs_list, step)
        try:
            rew = np.array(rews, dtype=np.float32)
        except (TypeError, ValueError):
            rew = None
        if rew is None or rew.shape != self.ep_ret.shape:
            raise EnvError(f"env {self.env_id!r} returned a reward that is not a number at vector step {step}: "
                           f"{rews}")
        self.ep_ret += rew
        self.t += 1
        self.last_obs = obs_list
        return obs, rew, ([self._ended(*e, step) for e in ended] if ended else ended)

    def _step_envs(self, start: int, actions: Any, obs_list: list, rews: list, ended: list, step: int) -> None:
        """The loop itself, as lean as a hand-written one: envs ``start ..`` step, those that end reset."""
        envs, acts = (self.envs, actions) if start == 0 else (self.envs[start:], actions[start:])
        for env, a in zip(envs, acts):
            o, r, terminated, truncated, info = env.step(a)
            if terminated or truncated:
                i = len(obs_list)
                ended.append((i, terminated, truncated, o, info))
                o = self._reset_env(i, step)
            obs_list.append(o)
            rews.append(r)

    def _step_rest(self, actions: Any, obs_list: list, rews: list, ended: list, err: Exception, step: int) -> None:
        """Env ``len(obs_list)`` raised: raise, or restart it and step the rest."""
        while True:
            i = len(obs_list)
            if self.on_error != "restart":
                raise EnvError(f"{self._where(i)} raised at vector step {step}: {_describe(err)}") from err
            ended.append((i, False, True, self.last_obs[i], None))  # info None: the broken episode is dropped
            obs_list.append(self._restart(i, err, step))
            rews.append(0.0)
            try:
                self._step_envs(i + 1, actions, obs_list, rews, ended, step)
                return
            except EnvError:
                raise
            except Exception as e:
                err = e

    def _reset_env(self, i: int, step: int) -> Any:
        try:
            return self.envs[i].reset()[0]
        except Exception as e:
            if self.on_error != "restart":
                raise EnvError(f"{self._where(i)} raised in reset at vector step {step}: {_describe(e)}") from e
            return self._restart(i, e, step)

    def _stack(self, obs_list: list, step: int) -> np.ndarray:
        """The observations as one array; any shape other than the space's is an error, never a broadcast."""
        try:
            arr = np.array(obs_list, dtype=self.obs_dtype)  # ragged shapes raise; the same wrong shape does not
        except (ValueError, TypeError):
            arr = None
        if arr is not None and arr.shape == self._batch_shape:
            return arr
        shapes = sorted({np.shape(o) for o in obs_list}, key=str)
        raise EnvError(
            f"env {self.env_id!r} returned observations of shape {', '.join(map(str, shapes))} at vector step "
            f"{step}; its observation space says {self.obs_shape}"
        )

    def _ended(self, i: int, terminated: bool, truncated: bool, final: Any, info: dict | None, step: int) -> Ended:
        """Close the books on env ``i``'s episode (after this step's reward is counted)."""
        if getattr(final, "shape", None) != self.obs_shape and np.shape(final) != self.obs_shape:
            raise EnvError(
                f"{self._where(i)} returned a final observation of shape {np.shape(final)} at vector step {step}; "
                f"its observation space says {self.obs_shape}"
            )
        if info is None:  # restarted: the broken episode is not reported
            episode = None
        elif self.external[i]:
            # The wrapper's raw score; the length counts this env's steps over the whole episode.
            raw = info.get(EPISODE_KEY)
            if raw is None:  # a life lost, not the game: the episode goes on
                return i, bool(terminated), bool(truncated), final, None
            episode = (float(raw), self.t - self.ep_start[i])
        else:
            episode = (float(self.ep_ret[i]), self.t - self.ep_start[i])
        self.ep_ret[i] = 0.0
        self.ep_start[i] = self.t
        return i, bool(terminated), bool(truncated), final, episode

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
        self.messages.append(
            f"{where} raised at vector step {step}: {_describe(err)}; rebuilt it from its factory, "
            f"dropped the unfinished episode (restart {self.env_restarts[i]} of this env)"
        )
        return o

    # --- state
    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"ep_ret": self.ep_ret.copy(), "ep_len": self.ep_len}
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
        self.ep_start = [self.t - int(length) for length in np.asarray(state["ep_len"]).tolist()]
        return True

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception as e:  # closing must not hide the error that brought us here
                warnings.warn(f"env {self.env_id!r}: close() raised {_describe(e)}", stacklevel=2)
