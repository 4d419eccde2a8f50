"""Dict and Tuple observations as one flat float32 vector plus a layout.

corral's storage and networks take one observation tensor. An env whose
observation space is a ``Dict`` or ``Tuple`` is wrapped so each observation is the
concatenation of its parts, and the new ``Box`` carries ``corral_layout``: one
``Part(key, shape, image, start, stop, onehot, nvec)`` per part. Box parts are
flattened (images too); integer parts stay compact, one slot per integer: a
``Discrete`` part takes 1 slot holding its value (less its ``start``), a
``MultiDiscrete`` part one slot per entry, a ``MultiBinary`` part its bits. The
networks one-hot the integer slots (``nvec``: categories per slot) in their encoder
(``MultiInputEncoder``), so rollouts and replay store one float per integer, not one
per category. float32 holds every integer below 2**24 exactly. Actors read the layout
to send image parts through a CNN, to find an ``action_mask`` part and to keep integer
parts out of the normalizer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

# float32 is exact for integers up to this; the flat vector is float32
MAX_CATEGORIES = 2 ** 24


class Part(NamedTuple):
    key: str
    shape: tuple[int, ...]
    image: bool
    start: int
    stop: int
    onehot: bool = False  # a Discrete / MultiDiscrete / MultiBinary part (integers or 0/1): never normalized
    nvec: tuple[int, ...] = ()  # categories per slot of a Discrete / MultiDiscrete part: one-hot in the encoder


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def _categories(key: str, space: gym.Space) -> tuple[tuple[int, ...], np.ndarray | None]:
    """(categories per slot, start per slot) of a Discrete / MultiDiscrete part; ``((), None)`` otherwise."""
    if isinstance(space, gym.spaces.Discrete):
        nvec, start = [int(space.n)], np.array([int(space.start)])
    elif isinstance(space, gym.spaces.MultiDiscrete):
        nvec = [int(n) for n in space.nvec.reshape(-1)]
        start = getattr(space, "start", None)
        start = np.reshape(start, -1).astype(np.int64) if start is not None else np.zeros(len(nvec), np.int64)
    else:
        return (), None
    if max(nvec) > MAX_CATEGORIES:
        raise ValueError(f"observation part {key!r} ({space}) has more than 2**24 categories: "
                         "corral stores integer parts in a float32 vector")
    return tuple(nvec), start


class FlattenParts(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        items = list(space.spaces.items()) if isinstance(space, gym.spaces.Dict) else \
            [(str(i), s) for i, s in enumerate(space.spaces)]
        self._keys = [k for k, _ in items]
        self._spaces = [s for _, s in items]
        # per part: the integer start to subtract (Discrete / MultiDiscrete), 0, or None for a
        # nested space (Dict in a Dict, ...), flattened by gymnasium
        self._starts = []
        layout, start = [], 0
        for key, sub in items:
            nvec, offset = _categories(key, sub)
            n = len(nvec) if nvec else int(gym.spaces.flatdim(sub))
            onehot = isinstance(sub, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
            layout.append(Part(key, tuple(sub.shape or ()), _is_image(sub), start, start + n, onehot, nvec))
            plain = isinstance(sub, (gym.spaces.Box, gym.spaces.MultiBinary))
            self._starts.append(offset if offset is not None else 0 if plain else None)
            start += n
        box = gym.spaces.Box(-np.inf, np.inf, (start,), np.float32)
        box.corral_layout = layout  # travels with the space (pickles with its __dict__)
        self.observation_space = box
        self._dict = isinstance(space, gym.spaces.Dict)

    def observation(self, obs: Any) -> np.ndarray:
        parts = [obs[k] for k in self._keys] if self._dict else list(obs)
        flat = []
        for space, p, s in zip(self._spaces, parts, self._starts):
            if s is None:
                flat.append(np.asarray(gym.spaces.flatten(space, p)).reshape(-1))
            else:  # integers as values (from 0), not one-hot
                a = np.asarray(p).reshape(-1)
                flat.append(a - s if isinstance(s, np.ndarray) and s.any() else a)
        return np.concatenate(flat, dtype=np.float32, casting="unsafe")


def flatten_parts(env: gym.Env) -> gym.Env:
    """Wrap Dict/Tuple observation envs; leave every other env as it is."""
    if isinstance(env.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return FlattenParts(env)
    return env


def layout_of(space: gym.Space) -> list[Part] | None:
    return getattr(space, "corral_layout", None)


def declare_frame_stack(space: gym.Space, k: int) -> gym.Space:
    """Mark ``space`` as a stack of the env's last ``k`` frames on its first axis (what
    corral's Atari envs produce), so replay stores each frame once. Returns ``space``."""
    space.corral_frame_stack = int(k)  # travels with the space (pickles with its __dict__)
    return space


def frame_stack_of(space: gym.Space) -> int:
    """Frames an observation of ``space`` stacks on its first axis, as its env declared (1: none)."""
    return int(getattr(space, "corral_frame_stack", 1))


def legacy_columns(layout: list[Part]) -> tuple[list[int], int] | None:
    """(each slot's column, the width) of the flat vector of corral before integer parts
    were stored compactly (a Discrete / MultiDiscrete part was one-hot there), so older
    normalizer statistics load. ``None`` when the two layouts are the same."""
    if not any(p.nvec for p in layout):
        return None
    cols, col = [], 0
    for p in layout:
        if p.nvec:
            for n in p.nvec:
                cols.append(col)  # a raw (never normalized) slot: any of its old columns will do
                col += n
        else:
            cols.extend(range(col, col + p.stop - p.start))
            col += p.stop - p.start
    return cols, col
