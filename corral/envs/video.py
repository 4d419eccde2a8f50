"""Recording episodes of a policy as MP4 files (imageio + the ffmpeg its wheel ships)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from corral.envs.group import EPISODE_KEY, layers, reports_episodes
from corral.envs.make import check_env, env_name, make_factory
from corral.envs.spaces import flatten_parts
from corral.errors import UserError
from corral.policy import as_policy


class VideoEpisode(NamedTuple):
    path: Path | None
    episode_return: float
    episode_length: int


def _writer(path: Path, fps: float):
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary comes with it)
    except ImportError:
        raise UserError("recording video needs imageio and imageio-ffmpeg: pip install 'corral[video]'") from None
    # Even sizes for yuv420p (what players expect); imageio pads a frame that is not.
    return imageio.get_writer(str(path), fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=2,
                              quality=7, ffmpeg_log_level="error")


def _make_rendering_env(env_spec: Any, kwargs: dict | None, atari_wrappers: Any) -> gym.Env:
    if isinstance(env_spec, gym.Env):
        env = make_factory(env_spec)()
    else:
        kw = dict(kwargs or {})
        kw.setdefault("render_mode", "rgb_array")
        try:
            env = make_factory(env_spec, kw, atari_wrappers=atari_wrappers)()
        except TypeError as e:
            raise UserError(
                f"env {env_name(env_spec)!r} does not take render_mode='rgb_array' ({e}); "
                "let its constructor accept render_mode to record video"
            ) from None
    if env.render_mode != "rgb_array":
        raise UserError(
            f"env {env_name(env_spec)!r} renders with render_mode={env.render_mode!r}; "
            "recording video needs render_mode='rgb_array'"
        )
    env = flatten_parts(env)
    check_env(env, env_name(env_spec))
    return env


def _fps(env: gym.Env, fps: float | None) -> float:
    if fps is not None:
        return float(fps)
    if type(env.unwrapped).__module__.startswith("ale_py"):
        base = 60  # the console's frame rate (ALE's metadata says 30)
    else:
        base = env.unwrapped.metadata.get("render_fps") or 30
    skip = 1
    for layer in layers(env):  # frames shown per agent step: the Atari frame skip
        skip *= int(getattr(layer, "frame_skip", 1) or 1)
    return max(1.0, float(base) / skip)


def record_video(
    act_fn: Callable[[torch.Tensor], Any],
    env_spec: Any,
    path_dir: str | Path,
    episodes: int = 1,
    *,
    kwargs: dict | None = None,
    seed: int = 0,
    fps: float | None = None,
    max_steps: int = 100_000,
    atari_wrappers: Any = "eval",
    name_prefix: str | None = None,
    device: str | torch.device = "cpu",
) -> list[VideoEpisode]:
    """Play ``episodes`` episodes of ``env_spec`` with ``act_fn`` and write one MP4 each.

    ``act_fn`` takes a batch of one observation (a tensor ``[1, *obs_shape]``, float32 or
    uint8 as the vector envs give it) and returns ``[1, *action_shape]`` (tensor or
    numpy), e.g. ``lambda o: algo.act(o, deterministic=True)`` or ``agent.act``.
    Frames come from ``render()`` with ``render_mode="rgb_array"``. Episode ``k`` is
    seeded with ``seed + k``. Files are ``<path_dir>/<name>-episode-<k>.mp4``; returns
    their paths with the raw episode return and length.
    """
    if episodes < 1:
        raise UserError(f"episodes must be >= 1, got {episodes}")
    out_dir = Path(path_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = name_prefix or re.sub(r"[^A-Za-z0-9_.-]+", "_", env_name(env_spec)).strip("_") or "env"
    env = _make_rendering_env(env_spec, kwargs, atari_wrappers)
    dev = torch.device(device)
    results = []
    try:
        rate = _fps(env, fps)
        for k in range(episodes):
            path = out_dir / f"{prefix}-episode-{k}.mp4"
            writer = _writer(path, rate)
            try:
                ret, length = _play(env, act_fn, seed + k, max_steps, dev, writer.append_data)
            finally:
                writer.close()
            results.append(VideoEpisode(path, ret, length))
    finally:
        env.close()
    return results


def _play(env: gym.Env, act_fn: Callable, seed: int, max_steps: int, dev: torch.device,
          frame: Callable[[np.ndarray], Any]) -> tuple[float, int]:
    """One episode of ``act_fn`` in ``env``, each rendered frame passed to ``frame``; (raw return, length)."""
    obs_space, act_space = env.observation_space, env.action_space
    obs_dtype = np.float32 if np.dtype(obs_space.dtype).kind == "f" else obs_space.dtype
    whole_episodes = reports_episodes(env)  # Atari: an episode is the whole game
    act_fn = as_policy(act_fn)
    act_fn.episodes_ended(torch.ones(1, dtype=torch.bool))  # a new episode (a recurrent policy resets)
    obs, _ = env.reset(seed=seed)
    total, length, raw = 0.0, 0, None
    frame(np.asarray(env.render(), dtype=np.uint8))
    for _ in range(max_steps):
        x = torch.as_tensor(np.asarray(obs, dtype=obs_dtype)[None], device=dev)
        with torch.no_grad():
            action = act_fn(x)
        action = action.detach().cpu().numpy() if isinstance(action, torch.Tensor) else np.asarray(action)
        action = action.reshape(act_space.shape if action.size == int(np.prod(act_space.shape)) else -1)
        if isinstance(act_space, gym.spaces.Discrete):
            action = int(np.asarray(action).reshape(-1)[0])
        else:
            action = np.clip(action.astype(act_space.dtype), act_space.low, act_space.high)
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        length += 1
        act_fn.rewarded(torch.tensor([float(reward)], device=dev))
        frame(np.asarray(env.render(), dtype=np.uint8))
        if terminated or truncated:
            act_fn.episodes_ended(torch.ones(1, dtype=torch.bool))
            raw = info.get(EPISODE_KEY)
            if raw is not None or not whole_episodes:
                break
            obs, _ = env.reset()  # a life lost under episodic life: the game goes on
    return float(raw if raw is not None else total), length


def episode_gif(
    act_fn: Callable[[torch.Tensor], Any],
    env_spec: Any,
    *,
    kwargs: dict | None = None,
    seed: int = 0,
    max_frames: int = 300,
    max_side: int = 256,
    atari_wrappers: Any = "eval",
    device: str | torch.device = "cpu",
) -> tuple[bytes, tuple[int, int], VideoEpisode]:
    """One episode as an animated GIF (what TensorBoard shows as a video): ``(gif bytes,
    (height, width), VideoEpisode with path None)``. Frames are shrunk to at most
    ``max_side`` pixels and thinned evenly to at most ``max_frames``, so a long episode
    stays a small file; the frame rate follows so it plays in real time."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise UserError("logging eval videos needs imageio: pip install 'corral[video]'") from None
    env = _make_rendering_env(env_spec, kwargs, atari_wrappers)
    frames: list[np.ndarray] = []
    try:
        rate = _fps(env, None)
        ret, length = _play(env, act_fn, seed, 100_000, torch.device(device), frames.append)
    finally:
        env.close()
    stride = -(-len(frames) // max_frames)  # ceil
    shrink = -(-max(frames[0].shape[:2]) // max_side)
    clip = [f[::shrink, ::shrink] for f in frames[::stride]]
    data = imageio.mimwrite("<bytes>", clip, format="GIF", duration=1000.0 * stride / rate, loop=0)
    return data, clip[0].shape[:2], VideoEpisode(None, ret, length)
