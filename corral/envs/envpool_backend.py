"""EnvPool backend: EnvPool's C++ envs and thread pool behind corral's vector-env contract.

EnvPool resets an env on the step *after* it ended (its action is ignored). corral
resets in the same step: where envs ended, the pool is stepped once more for those
envs only, and their reset observations replace the final ones in ``obs`` while
``info["final_obs"]`` keeps the final ones. With Atari's episodic life that extra step
is how EnvPool continues the game after a lost life, as it would on its own.

Only ids EnvPool implements work here (``envpool.list_all_envs()``); Atari ids
(``Pong``, ``ALE/Pong-v5``, ``Pong-v5``) get EnvPool's own preprocessing configured like
:class:`corral.envs.atari.AtariOptions` (sticky actions 0.25 as in ALE v5 unless
``env.repeat_action_probability`` says otherwise; EnvPool's own default, which CleanRL's
``ppo_atari_envpool.py`` runs, is 0). Observations, rewards and flags have the sync backend's
layout and scale (uint8 ``[4, 84, 84]``, clipped rewards in training, a lost life
``terminated`` without a finished episode, the raw score in ``episode_return``). EnvPool's
physics and random streams are its own: the same seed gives other episodes than the
Gymnasium envs of the sync backend, and its details differ slightly (no-ops drawn from
0 .. noop_max - 1, its own FIRE-on-reset steps: on Pong with no no-ops and no sticky actions
its frames run two agent steps behind the sync backend's).
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any

import numpy as np
import torch

from corral.envs.base import EnvError
from corral.envs.host import HostVecEnv, tree_to_torch
from corral.envs.make import check_env, env_name
from corral.envs.spaces import declare_frame_stack
from corral.errors import UserError


def _import_envpool():
    try:
        import envpool
    except ImportError:
        raise UserError("backend 'envpool' needs EnvPool: pip install 'corral[envpool]' (Linux x86_64)") from None
    return envpool


def resolve_envpool_id(spec: str, envpool: Any) -> tuple[str, bool]:
    """(EnvPool task id, whether it is Atari) for what a user named: ``CartPole-v1``,
    ``Pong``, ``ALE/Pong-v5`` or ``Pong-v5``."""
    known = list(envpool.list_all_envs())
    lower = {k.lower(): k for k in known}
    name = spec.removeprefix("ALE/")
    for cand in (name, f"{name}-v5"):
        task = cand if cand in lower.values() else lower.get(cand.lower())
        if task is not None:
            config = envpool.make_spec(task).config
            return task, hasattr(config, "episodic_life") and hasattr(config, "stack_num")
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UserError(f"EnvPool has no env {spec!r}{hint}; other envs run on backend 'sync' or 'subproc'")


def _action_one_is_fire(task: str) -> bool:
    """Whether action 1 of Atari game ``task`` (``Breakout-v5``) is FIRE, from ale-py's action set
    (False without ale-py: then only EnvPool's FIRE on reset)."""
    from corral.envs.atari import needs_fire, register_ale

    if not register_ale():
        return False
    import gymnasium as gym

    env = gym.make(f"ALE/{task}")
    try:
        return needs_fire(env)
    finally:
        env.close()


class EnvPoolVecEnv(HostVecEnv):
    """``num_envs`` EnvPool envs, synchronous (the whole batch each step)."""

    _discrete_as_array = True

    def __init__(
        self,
        spec: Any,
        num_envs: int,
        kwargs: dict | None = None,
        device: str | torch.device = "cpu",
        atari_wrappers: Any = True,
        strict: bool = False,
        check_finite: bool = True,
        num_threads: int = 0,
    ):
        if not isinstance(spec, str):
            raise UserError(f"backend 'envpool' takes an env id, not {type(spec).__name__}; use backend 'sync' or 'subproc'")
        envpool = _import_envpool()
        task, atari = resolve_envpool_id(spec, envpool)
        options: dict[str, Any] = dict(kwargs or {})
        self._episodic_life = self._fire_after_lost_life = self._fire_on_reset = False
        if atari:
            from corral.envs.atari import atari_options

            o = atari_options(atari_wrappers)
            if o is None:
                raise UserError("backend 'envpool' always preprocesses Atari; use backend 'sync' for raw ALE frames")
            if "frameskip" in options:
                o.frame_skip = int(options.pop("frameskip"))
            defaults = {
                # EnvPool draws 0 .. noop_max - 1 no-ops (Gymnasium's AtariPreprocessing 1 .. noop_max)
                # and crashes (SIGSEGV) on noop_max 0; its 1 is "no no-ops", corral's 0
                "noop_max": max(1, o.noop_max), "frame_skip": o.frame_skip, "img_height": o.screen_size,
                "img_width": o.screen_size, "gray_scale": o.grayscale, "stack_num": o.frame_stack,
                "episodic_life": o.episodic_life, "reward_clip": o.clip_rewards, "use_fire_reset": o.fire_reset,
                "repeat_action_probability": 0.25,
            }
            options = {**defaults, **options}
            self._episodic_life = bool(options["episodic_life"])
            # EnvPool presses FIRE on reset only, and under sticky actions its press does not launch
            # Breakout's ball (EnvPool 1.2.5): a policy that never fires would wait until the episode
            # cap. corral presses FIRE itself where EnvPool does not, as FireReset does on the sync
            # backend: after a lost life without episodic life (evaluation), and on every (re)start
            # under sticky actions.
            fire = bool(options["use_fire_reset"]) and _action_one_is_fire(task)
            self._fire_after_lost_life = fire and not self._episodic_life
            self._fire_on_reset = fire and float(options["repeat_action_probability"]) > 0
        self._envpool, self._task, self._options, self._atari = envpool, task, options, atari
        self._num_threads = num_threads
        self._n = num_envs
        self._pool = None
        self._make(int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - num_envs)))
        pool = self._pool
        check_env(pool, env_name(spec))  # type: ignore[arg-type]
        if atari and int(options["stack_num"]) > 1:  # frames on the first axis: [stack_num * channels, H, W]
            declare_frame_stack(pool.observation_space, int(options["stack_num"]))
        self._init_front(num_envs, pool.observation_space, pool.action_space, env_name(spec), device, check_finite,
                         strict)
        self._ep_ret = np.zeros(num_envs, dtype=np.float64)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self.restarts = 0
        self.copyable = False

    def _make(self, seed: int) -> None:
        if self._pool is not None:
            self._pool.close()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # EnvPool warns about Gymnasium API details on every make
                self._pool = self._envpool.make_gymnasium(
                    self._task, num_envs=self._n, batch_size=self._n, seed=seed, num_threads=self._num_threads,
                    **self._options,
                )
                self._pool.observation_space, self._pool.action_space  # built (and warned about) here
        except (TypeError, ValueError, RuntimeError) as e:
            raise UserError(f"EnvPool env {self._task!r} rejected its options {self._options}: {e}") from None

    def _reset_arrays(self, seed):
        if seed is not None:  # EnvPool seeds env i with seed + i when the pool is made
            self._make(int(seed))
        obs, info = self._pool.reset()
        if self._atari:
            self._lives[info["env_id"]] = info["lives"]
        if self._fire_on_reset:
            obs = np.array(obs)
            self._press_fire(np.arange(self._n), obs)
        self._ep_ret[:] = 0.0
        self._ep_len[:] = 0
        return obs

    def _step_arrays(self, acts):
        try:
            obs, rew, term, trunc, info = self._pool.step(acts)
        except Exception as e:
            raise EnvError(f"env {self.env_id!r} (EnvPool) raised at vector step {self.steps}: {type(e).__name__}: {e}") from e
        if self._fire_after_lost_life:
            lost = np.nonzero((np.asarray(info["lives"]) < self._lives) & ~(term | trunc))[0]
            if len(lost):
                obs, rew, term, trunc = np.array(obs), np.array(rew), np.array(term), np.array(trunc)
                info = {**info, "reward": np.array(info["reward"]), "terminated": np.array(info["terminated"])}
                order, f_rew, f_term, f_trunc, f_info = self._press_fire(lost, obs)
                rew[order] += f_rew
                term[order] |= f_term
                trunc[order] |= f_trunc
                info["reward"][order] += f_info["reward"]
                info["terminated"][order] = f_info["terminated"]
        if self._atari:
            self._lives[info["env_id"]] = info["lives"]
        raw = info["reward"] if self._atari else rew
        self._ep_ret += raw
        self._ep_len += 1
        done = term | trunc
        finals: dict[int, Any] = {}
        episodes: list[tuple[int, float, int]] = []
        if done.any():
            if self._episodic_life:
                ended = trunc | info["terminated"].astype(bool)
            else:
                ended = done
            for i in np.nonzero(ended)[0]:
                episodes.append((int(i), float(self._ep_ret[i]), int(self._ep_len[i])))
            self._ep_ret[ended] = 0.0
            self._ep_len[ended] = 0
            ids = np.nonzero(done)[0]
            obs = np.array(obs)
            finals = {int(i): obs[i].copy() for i in ids}
            # EnvPool's own autoreset: one step of the ended envs only (their actions are ignored).
            zero = np.zeros((len(ids), *acts.shape[1:]), dtype=acts.dtype)
            new_obs, _, _, _, new_info = self._pool.step(zero, ids.astype(np.int32))
            order = new_info["env_id"]
            obs[order] = new_obs
            if self._atari:
                self._ep_ret[order] += new_info["reward"]
                self._lives[order] = new_info["lives"]
            if self._fire_on_reset:
                order, _, _, _, f_info = self._press_fire(ids, obs)
                self._ep_ret[order] += f_info["reward"]
        return obs, finals, rew, term, trunc, episodes

    def _press_fire(self, ids: np.ndarray, obs: np.ndarray):
        """One FIRE step of envs ``ids``; their observations in ``obs`` (writable) become its own.
        Returns the envs' order and the step's reward, flags and info."""
        fire = np.ones(len(ids), dtype=np.int32)
        f_obs, f_rew, f_term, f_trunc, f_info = self._pool.step(fire, ids.astype(np.int32))
        order = f_info["env_id"]
        obs[order] = f_obs
        self._lives[order] = f_info["lives"]
        return order, f_rew, f_term, f_trunc, f_info

    def state_dict(self) -> dict[str, Any]:
        return tree_to_torch({"copyable": False, "steps": self.steps, "ep_ret": self._ep_ret.copy(),
                              "ep_len": self._ep_len.copy()})

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """EnvPool's env state cannot be copied: a resumed run starts fresh episodes."""
        self.steps = int(state.get("steps", 0))
        return False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
