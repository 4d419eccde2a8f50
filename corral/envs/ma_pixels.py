"""Multi-agent pixel envs (PettingZoo's butterfly family: ``pistonball_v6``,
``cooperative_pong_v6``, ``knights_archers_zombies_v10`` with ``vector_state=False``): each
agent's image observation, and the env's image ``state()``, preprocessed as corral's Atari
envs preprocess theirs.

Where every agent's observation is an image (a uint8 ``Box`` ``[H, W, C]`` or ``[H, W]``),
:class:`~corral.envs.multiagent.MultiAgentVecEnv` keeps, per env and per agent, the last
``stack`` frames, each converted to grey (``grey``) and resized to ``size x size`` (OpenCV's
area interpolation), and packs them **as uint8**: the packed row is
``[obs A x (stack*c, size, size) | state (stack*c, state_size, state_size) | agent_mask A |
action_mask A*K]``, all uint8 (``c`` 1 grey, 3 RGB). The env's ``state()`` (the whole screen)
goes through the same preprocessing at ``state_size``; an env without an image state has no
state part (``state_dim`` 0: IPPO only). The layout's ``frame`` is the per-agent stack's shape,
``(stack*c, size, size)``, its ``state_frame`` the state's.

Options (``env.pixels``, a dict): ``size`` (default 84; at least 36, the Nature CNN's
smallest side), ``grey`` (default true), ``stack`` (default 4), ``state_size`` (default 0:
half of ``size``, at least 36; MAPPO's centralized value reads the whole scene, where a
coarser picture does, at a ninth of the CNN's cost at 84), ``skip`` (default 1: frame skip,
each joint action held for ``skip`` env steps with the rewards summed, stopping early where an
agent's episode ends; a vector step is then ``skip`` frames, as an Atari env's is 4), ``invert``
(default false: true stores ``255 - value``, so a bright background is 0 as Atari's dark one is;
the Nature CNN's untrained features barely tell near-white frames apart). A packed step of pistonball (20
agents) at the defaults is 20 x 4 x 84 x 84 + 4 x 42 x 42 bytes = 0.57 MB, against
20 x 457 x 120 x 3 + 560 x 880 x 3 float32 values (19 MB) before.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from corral.envs.agent_layout import AgentLayout
from corral.envs.options import options_from_dict
from corral.errors import UserError

MIN_SIZE = 36  # the Nature CNN's smallest side (8x8 stride 4, 4x4 stride 2, 3x3 stride 1)


@dataclass(frozen=True)
class PixelOptions:
    """How multi-agent image observations are preprocessed (``env.pixels``)."""

    size: int = 84
    """frames are resized to size x size"""
    grey: bool = True
    """grey frames (false: RGB, 3 channels a frame)"""
    stack: int = 4
    """each observation stacks this many last frames (1: no stacking)"""
    state_size: int = 0
    """the env's image state is resized to state_size x state_size (0: half of size, at least 36)"""
    skip: int = 1
    """frame skip: each joint action is held for this many env steps, the rewards summed (Atari's 4)"""
    invert: bool = False
    """store 255 - value: a bright background (pistonball's white screen) becomes 0, as Atari's dark one"""

    @property
    def state_side(self) -> int:
        return self.state_size or max(MIN_SIZE, self.size // 2)


def pixel_options(value: Any) -> PixelOptions:
    """``env.pixels`` (a dict, None, or :class:`PixelOptions`) -> :class:`PixelOptions`."""
    if isinstance(value, PixelOptions):
        opts = value
    elif value is None:
        opts = PixelOptions()
    elif isinstance(value, dict):
        opts = options_from_dict(PixelOptions, value, "env.pixels option")
    else:
        raise UserError(f"env.pixels must be a dict such as {{size: 84, grey: true, stack: 4}}, got {value!r}")
    if not isinstance(opts.size, int) or opts.size < MIN_SIZE:
        raise UserError(f"env.pixels.size must be an integer >= {MIN_SIZE} (the Nature CNN's smallest side), "
                        f"got {opts.size!r}")
    if not isinstance(opts.state_size, int) or (opts.state_size and opts.state_size < MIN_SIZE):
        raise UserError(f"env.pixels.state_size must be 0 (half of size) or an integer >= {MIN_SIZE}, "
                        f"got {opts.state_size!r}")
    if not isinstance(opts.stack, int) or opts.stack < 1:
        raise UserError(f"env.pixels.stack must be an integer >= 1, got {opts.stack!r}")
    if not isinstance(opts.skip, int) or opts.skip < 1:
        raise UserError(f"env.pixels.skip must be an integer >= 1 (1: every frame), got {opts.skip!r}")
    return opts


def is_image_space(space: gym.Space) -> bool:
    """A uint8 Box ``[H, W, C]`` (C 1, 3 or 4) or ``[H, W]``: a picture, not a vector."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    shape = space.shape
    return (len(shape) == 3 and shape[-1] in (1, 3, 4) and min(shape[:2]) > 4) or \
        (len(shape) == 2 and min(shape) > 4)


def _colour(space: gym.Space) -> bool:
    return len(space.shape) == 3 and space.shape[-1] >= 3


def pixel_layout(env: Any, layout: AgentLayout, parts: list[gym.Space], pixels: Any, name: str) -> AgentLayout | None:
    """The layout of a pixel env's packed uint8 rows (None when the agents' observations are not images)."""
    images = [is_image_space(p) for p in parts]
    if not any(images):
        if pixels:
            raise UserError(f"env.pixels applies to envs whose agents observe images; {name!r}'s agents observe "
                            f"{parts[0]}: leave env.pixels unset")
        return None
    if not all(images):
        odd = [a for a, im in zip(layout.agents, images) if not im]
        raise UserError(f"env {name!r}: agents {odd[:3]} observe vectors while the others observe images; corral's "
                        "multi-agent pixel envs need every agent to observe an image")
    opts = pixel_options(pixels)
    c = 3 if not opts.grey and all(_colour(p) for p in parts) else 1
    frame = (opts.stack * c, opts.size, opts.size)
    D = math.prod(frame)
    state_space = getattr(env, "state_space", None)
    has_state = layout.has_state and state_space is not None and is_image_space(state_space)
    state_frame = (opts.stack * (3 if c == 3 and _colour(state_space) else 1), opts.state_side, opts.state_side) \
        if has_state else ()
    return dataclasses.replace(layout, obs_dim=D, obs_dims=(D,) * layout.n_agents, state_dim=math.prod(state_frame),
                               has_state=has_state, frame=frame, state_frame=state_frame)


def _cv2():
    try:
        import cv2
    except ImportError:
        raise UserError("multi-agent pixel envs resize frames with OpenCV: pip install opencv-python-headless "
                        "(or 'corral[atari]')") from None
    return cv2


class FrameStacks:
    """The last ``stack`` preprocessed frames of each env's agents and state, written into
    packed uint8 rows (see the module docstring)."""

    def __init__(self, layout: AgentLayout, num_envs: int, pixels: Any = None):
        self.layout = layout
        self.cv2 = _cv2()
        opts = pixel_options(pixels)
        stack = opts.stack
        A = layout.n_agents
        self.obs = np.zeros((num_envs, A, *layout.frame), np.uint8)
        self.state = np.zeros((num_envs, *layout.state_frame), np.uint8) if layout.has_state else None
        # (channels of one frame: 1 grey, 3 RGB; side) of the agents' frames and the state's
        self.obs_frame = (layout.frame[0] // stack, layout.frame[1])
        self.state_frame = (layout.state_frame[0] // stack, layout.state_frame[1]) if layout.has_state else None
        self.invert = opts.invert
        self.started = np.zeros((num_envs, A + 1), bool)  # slot A: the state
        self.state_failures = 0

    def warn_if_black(self, name: str) -> None:
        """Warn once where every agent's first frames are black: an env that draws its screen only in
        ``render()`` (PettingZoo's cooperative_pong) shows black frames without a render mode."""
        if getattr(self, "_checked", False):
            return
        self._checked = True
        if not self.obs.any():
            warnings.warn(f"env {name!r}: every agent's first observation is a black frame; an env that draws its "
                          "screen only in render() needs env.kwargs.render_mode=rgb_array (cooperative_pong_v6 "
                          "does; docs/multiagent.md)", stacklevel=3)

    def restart(self, i: int) -> None:
        """Env ``i`` was reset: its next frames fill every slot of their stacks."""
        self.started[i] = False

    def frame(self, img: Any, shape: tuple[int, int]) -> np.ndarray:
        """One image -> ``[c, side, side]`` uint8, ``shape`` = ``(c, side)``."""
        cv2 = self.cv2
        c, side = shape
        a = np.asarray(img)
        if a.ndim == 3 and a.shape[-1] == 1:
            a = a[..., 0]
        if a.ndim == 3:
            a = a[..., :3]
        # pygame screens reach us transposed (PettingZoo's rot90 + fliplr of a surface array): work on
        # the contiguous transpose and transpose the small result back (grey and a square resize
        # commute with it), not a strided copy of the whole screen
        flip = not a.flags.c_contiguous and a.swapaxes(0, 1).flags.c_contiguous
        if flip:
            a = a.swapaxes(0, 1)
        if a.ndim == 3 and c == 1:
            a = cv2.cvtColor(np.ascontiguousarray(a), cv2.COLOR_RGB2GRAY)
        a = cv2.resize(np.ascontiguousarray(a), (side, side), interpolation=cv2.INTER_AREA)
        if flip:
            a = a.swapaxes(0, 1)
        if self.invert:
            a = 255 - a
        return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)

    def _push(self, stack: np.ndarray, img: Any, fresh: bool, shape: tuple[int, int]) -> None:
        f = self.frame(img, shape)
        c = f.shape[0]
        if fresh:
            stack[:] = np.tile(f, (stack.shape[0] // c, 1, 1))
        else:
            stack[:-c] = stack[c:]
            stack[-c:] = f

    def agent(self, i: int, j: int, img: Any, row: np.ndarray) -> None:
        """Agent ``j`` of env ``i`` observed ``img``: push it and write the agent's stack into ``row``."""
        D = self.layout.obs_dim
        self._push(self.obs[i, j], img, not self.started[i, j], self.obs_frame)
        self.started[i, j] = True
        row[j * D:(j + 1) * D] = self.obs[i, j].reshape(-1)

    def global_state(self, i: int, env: Any, row: np.ndarray) -> None:
        """Push env ``i``'s ``state()`` and write its stack into ``row`` (zeros where the env cannot give it)."""
        L = self.layout
        if self.state is None:
            return
        try:
            img = env.state()
        except Exception:  # noqa: BLE001 - the env's own state() failing: the state part stays zeros
            self.state_failures += 1
            return
        A = L.n_agents
        self._push(self.state[i], img, not self.started[i, A], self.state_frame)
        self.started[i, A] = True
        row[L.state_start:L.mask_start] = self.state[i].reshape(-1)
