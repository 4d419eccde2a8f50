"""Atari through ale-py, with the standard preprocessing composed from Gymnasium wrappers.

Inner to outer: the ALE env (``frameskip=1``; sticky actions as ALE v5 sets them),
``AtariPreprocessing`` (random no-ops on reset, frame skip 4 with a max over the last
two frames, 84x84 gray), :class:`RawEpisodeStats` (the raw game score of the
whole game, reported to the vector env), :class:`EpisodicLife` (training: a lost life
reads as ``terminated``, the game goes on), :class:`FireReset` (games that wait for
FIRE, after a reset and after a lost life), reward clipping to [-1, 1] (training), and a
stack of the last 4 frames: observations are uint8 ``[4, 84, 84]``. Episodes end at ALE's
cap, 108,000 frames (27,000 agent steps), unless ``max_episode_steps`` sets another.

Because the score is taken below clipping and episodic life, ``info["episode_return"]``
is the game score whatever the agent trains on, and an episode is the whole game.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from corral.envs.group import EPISODE_KEY
from corral.envs.options import options_from_dict
from corral.envs.spaces import declare_frame_stack
from corral.errors import UserError

# Games people name most, so a short name can say "install ale-py" before ale-py is there.
COMMON_GAMES = (
    "Alien", "Amidar", "Assault", "Asterix", "Asteroids", "Atlantis", "BankHeist", "BattleZone", "BeamRider",
    "Boxing", "Breakout", "Centipede", "DemonAttack", "Enduro", "Freeway", "Frostbite", "Gopher", "Gravitar",
    "Hero", "IceHockey", "Jamesbond", "Kangaroo", "Krull", "MontezumaRevenge", "MsPacman", "Pitfall", "Pong",
    "PrivateEye", "Qbert", "Riverraid", "RoadRunner", "Seaquest", "Skiing", "Solaris", "SpaceInvaders",
    "Tennis", "TimePilot", "Tutankham", "UpNDown", "Venture", "VideoPinball", "WizardOfWor", "Zaxxon",
)


@dataclass
class AtariOptions:
    """The preprocessing ``make_vec_env(..., atari_wrappers=...)`` applies to ALE ids."""

    noop_max: int = 30
    """at most this many no-op actions after a reset (a random number of them)"""
    frame_skip: int = 4
    """repeat each action this many frames; the observation is the max of the last two"""
    screen_size: int = 84
    """observations are resized to screen_size x screen_size"""
    grayscale: bool = True
    """gray observations (False: RGB, shape [H, W, 3] per frame)"""
    frame_stack: int = 4
    """observations stack this many last frames (1: no stacking)"""
    episodic_life: bool = True
    """a lost life reads as terminated (for value targets); the episode stats still span the whole game"""
    clip_rewards: bool = True
    """rewards clipped to [-1, 1] for training; the reported return stays the raw score"""
    fire_reset: bool = True
    """press FIRE after a reset, and after a lost life that does not end the episode (no
    episodic life: evaluation), in games whose action set has it (Breakout waits for it)"""
    max_episode_steps: int | None = None
    """end an episode (truncated) after this many agent steps, i.e. ``max_episode_steps *
    frame_skip`` frames (ALE's ``max_num_frames_per_episode``); None: ALE's own, 108,000 frames"""


def atari_options(value: Any) -> AtariOptions | None:
    """``True`` -> training defaults, ``"eval"`` -> no episodic life or clipping, a dict or
    :class:`AtariOptions` -> those options, ``False`` / ``None`` -> no wrappers."""
    if value is None or value is False:
        return None
    if value is True:
        return AtariOptions()
    if value == "eval":
        return AtariOptions(episodic_life=False, clip_rewards=False)
    if isinstance(value, AtariOptions):
        return value
    if isinstance(value, dict):
        return options_from_dict(AtariOptions, value, "Atari wrapper option")
    raise UserError(f"atari_wrappers must be True, False, 'eval' or a dict of options, got {value!r}")


def register_ale() -> bool:
    """Register the ALE ids with Gymnasium; False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def resolve_short_name(name: str) -> str | None:
    """``"Pong"`` / ``"pong"`` -> ``"ALE/Pong-v5"``; None when ``name`` is not a game name.

    Raises a UserError naming the extra when ``name`` is a well-known game and ale-py is
    missing."""
    if "/" in name or "-v" in name or ":" in name or not name.isalnum():
        return None
    if not register_ale():
        if name.lower() in {g.lower() for g in COMMON_GAMES}:
            raise UserError(f"env {name!r} is an Atari game and needs ale-py: pip install 'corral[atari]'")
        return None
    games = {k[4:-3].lower(): k for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5")}
    return games.get(name.lower())


def is_ale_id(env_id: str) -> bool:
    if env_id not in gym.registry:
        return False
    entry = gym.registry[env_id].entry_point
    entry = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    return entry.startswith("ale_py")


class RawEpisodeStats(gym.Wrapper):
    """Sums the raw reward over the whole game; on the step that ends it,
    ``info["corral_episode"]`` holds that score for the vector env to report."""

    corral_reports_episodes = True

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.episode_return = 0.0

    def reset(self, **kwargs):
        self.episode_return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        if terminated or truncated:
            info = dict(info)
            info[EPISODE_KEY] = self.episode_return
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life reads as ``terminated``; the following ``reset()`` takes a no-op step
    and the game goes on. A real reset happens at game over or when a seed is given."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        if self.game_over or seed is not None or options:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the game ended on the no-op itself
                obs, info = self.env.reset()
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after each reset, for games that wait for it, and FIRE
    after a lost life that does not end the episode. With episodic life underneath (training)
    a lost life already ends the episode, and the reset after it fires; without (evaluation),
    Breakout would otherwise wait for FIRE until the episode cap if the policy never presses it."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset()
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset()
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self.lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(1)
            reward += fire_reward
            lives = self.env.unwrapped.ale.lives()
        self.lives = lives
        return obs, reward, terminated, truncated, info


def needs_fire(env: gym.Env) -> bool:
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def wrap_atari(env: gym.Env, options: AtariOptions | None = None) -> gym.Env:
    """Apply the preprocessing in ``options`` to an ALE env made with ``frameskip=1``."""
    o = options or AtariOptions()
    try:
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=o.noop_max, frame_skip=o.frame_skip, screen_size=o.screen_size,
            grayscale_obs=o.grayscale, terminal_on_life_loss=False,
        )
    except gym.error.DependencyNotInstalled:
        raise UserError("Atari preprocessing needs OpenCV: pip install 'corral[atari]'") from None
    env = RawEpisodeStats(env)
    if o.episodic_life:
        env = EpisodicLife(env)
    if o.fire_reset and needs_fire(env):
        env = FireReset(env)
    if o.clip_rewards:
        env = gym.wrappers.ClipReward(env, -1.0, 1.0)
    if o.frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, o.frame_stack)
        declare_frame_stack(env.observation_space, o.frame_stack)  # [k, H, W] (RGB: [k, H, W, 3])
    return env


def make_atari(env_id: str, kwargs: dict | None = None, options: AtariOptions | None = None) -> gym.Env:
    """One preprocessed Atari env. ``kwargs`` go to ``gym.make``, except ``frameskip``,
    which sets the preprocessing's frame skip (the ALE env itself always skips none)."""
    kwargs = dict(kwargs or {})
    o = dataclasses.replace(options or AtariOptions())
    if "frameskip" in kwargs:
        o.frame_skip = int(kwargs.pop("frameskip"))
    if o.max_episode_steps is not None:
        kwargs["max_num_frames_per_episode"] = int(o.max_episode_steps) * o.frame_skip
    return wrap_atari(gym.make(env_id, frameskip=1, **kwargs), o)
