"""Structured observations as one flat float32 vector plus a layout.

corral's storage and networks take one observation tensor. An env whose
observation space is a ``Dict``, ``Tuple``, ``Text`` or ``OneOf`` is wrapped so each
observation is the concatenation of its parts, and the new ``Box`` carries
``corral_layout``: one ``Part(key, shape, image, start, stop, onehot, nvec)`` per part.
Box parts are flattened (images too); integer parts stay compact, one slot per integer:
a ``Discrete`` part takes 1 slot holding its value (less its ``start``), a
``MultiDiscrete`` part one slot per entry, a ``MultiBinary`` part its bits, a ``Text``
part one slot per character (its index in the charset; ``len(charset)`` pads), a
``OneOf`` part one slot for which subspace and then that subspace flattened by
Gymnasium (zero-padded to the largest). The networks one-hot the integer slots
(``nvec``: categories per slot) in their encoder (``MultiInputEncoder``), so rollouts and
replay store one float per integer, not one per category. float32 holds every integer
below 2**24 exactly. Actors read the layout to send image parts through a CNN, to find
an ``action_mask`` part and to keep integer parts out of the normalizer.

``Graph`` and ``Sequence`` observations (a varying size) and spaces corral does not know
are refused before a run starts, with one ``UserError`` naming the space and the fix.
MiniGrid and BabyAI envs are recognised and re-encoded first (:class:`MiniGridObs`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from corral.envs.goal import attach_goal
from corral.errors import UserError

# float32 is exact for integers up to this; the flat vector is float32
MAX_CATEGORIES = 2 ** 24
# the smallest side the Nature CNN takes (8x8 stride 4, 4x4 stride 2, 3x3 stride 1)
MIN_CNN_SIDE = 36


class Part(NamedTuple):
    key: str
    shape: tuple[int, ...]
    image: bool
    start: int
    stop: int
    onehot: bool = False  # a Discrete / MultiDiscrete / MultiBinary part (integers or 0/1): never normalized
    nvec: tuple[int, ...] = ()  # categories per slot of a Discrete / MultiDiscrete part: one-hot in the encoder


def image_sides(shape: tuple[int, ...]) -> tuple[int, int]:
    """The two spatial sides of a 3-d image shape, channels first or last (as the Nature CNN reads it)."""
    if shape[-1] <= 4 < shape[0]:  # channels last (CarRacing's 96x96x3)
        return int(shape[0]), int(shape[1])
    return int(shape[1]), int(shape[2])


def cnn_fits(shape: tuple[int, ...]) -> bool:
    """Whether a 3-d image of ``shape`` is large enough for the Nature CNN (sides >= 36)."""
    return len(shape) == 3 and min(image_sides(tuple(shape))) >= MIN_CNN_SIDE


def _is_image(space: gym.Space) -> bool:
    """A uint8 Box with 3 dims large enough for the Nature CNN; smaller ones are flattened."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8 \
        and cnn_fits(space.shape)


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


# ---------------------------------------------------------------------------
# Which spaces corral takes, and one message for those it does not

_PLAIN = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
_FIX = ("wrap the env in a gymnasium.ObservationWrapper whose observation_space is a Box, Discrete, "
        "MultiDiscrete, MultiBinary, Text, OneOf, or a Dict / Tuple of those")


def _refusal(space: gym.Space, where: str) -> str | None:
    """Why ``space`` (at ``where`` in the observation) cannot be encoded, or None."""
    at = f" (at {where})" if where else ""
    name = type(space).__name__
    if isinstance(space, (*_PLAIN, gym.spaces.Text)):
        return None
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        for k, sub in items:
            why = _refusal(sub, f"{where}.{k}" if where else str(k))
            if why:
                return why
        return None
    if isinstance(space, gym.spaces.OneOf):
        for i, sub in enumerate(space.spaces):
            why = _refusal(sub, f"{where}[{i}]" if where else f"[{i}]")
            if why:
                return why
        return None
    if isinstance(space, gym.spaces.Graph):
        return (f"observation space {name}{at} is not supported: a graph has a varying number of nodes and "
                "edges, and corral's networks take fixed-size inputs; " + _FIX +
                " (e.g. node features padded to a maximum count plus a node mask)")
    if isinstance(space, gym.spaces.Sequence):
        return (f"observation space {name}{at} is not supported: a sequence has a varying length, and corral's "
                "networks take fixed-size inputs; " + _FIX + " (e.g. the last K items, zero-padded, plus a mask)")
    return (f"observation space {name}{at} ({space}) is not supported: corral does not know how to encode it; "
            + _FIX)


def check_observation_space(space: gym.Space, name: str = "env") -> None:
    """Refuse, with one ``UserError`` naming the space and the fix, an observation space corral
    cannot encode: ``Graph``, ``Sequence`` and unknown ``Space`` subclasses, anywhere in it."""
    why = _refusal(space, "")
    if why:
        raise UserError(f"env {name!r}: {why}")


def _env_label(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


# ---------------------------------------------------------------------------
# MiniGrid and BabyAI

# Every word of MiniGrid's and BabyAI's missions (minigrid 3.2: every registered id, checked), in a fixed order: the
# bag of words of a mission is one 0/1 flag per word, the last flag for any other word.
MISSION_VOCAB = (
    "a", "after", "agent", "and", "at", "avoid", "ball", "behind", "blue", "box", "door", "empty", "end",
    "fetch", "find", "floor", "from", "front", "get", "go", "goal", "green", "grey", "hallway", "in", "key",
    "lava", "left", "matching", "maze", "must", "near", "next", "object", "of", "on", "open", "opening", "pick",
    "purple", "put", "reach", "red", "right", "room", "rooms", "square", "the", "then", "to", "traverse", "unlock",
    "up", "use", "wall", "yellow", "you", "your",
)
_WORD_INDEX = {w: i for i, w in enumerate(MISSION_VOCAB)}


def bag_of_words(mission: str) -> np.ndarray:
    """One 0/1 flag per word of ``MISSION_VOCAB`` (and a last one for any other word) in ``mission``."""
    out = np.zeros(len(MISSION_VOCAB) + 1, np.int8)
    for word in re.findall(r"[a-z]+", str(mission).lower()):
        out[_WORD_INDEX.get(word, len(MISSION_VOCAB))] = 1
    return out


def _is_minigrid(env: gym.Env) -> bool:
    unwrapped = getattr(env, "unwrapped", env)
    if not type(unwrapped).__module__.startswith("minigrid"):
        return False
    try:
        from minigrid.minigrid_env import MiniGridEnv
    except ImportError:
        return False
    return isinstance(unwrapped, MiniGridEnv)


class MiniGridObs(gym.ObservationWrapper):
    """MiniGrid's and BabyAI's ``mission`` (a string, in a ``MissionSpace`` corral cannot
    encode) as a bag of words: a ``MultiBinary`` flag per word of ``MISSION_VOCAB`` plus one
    for any other word (never normalized). Word order is lost ("put the red ball next to the
    blue box" reads as its swap), which BabyAI's GoTo / Open / PickUp levels never need.

    The rest stays: ``direction`` is a ``Discrete(4)`` (one-hot in the network), and the
    symbolic ``image`` (7x7x3 uint8: object, colour, state per cell) is too small for the
    Nature CNN, so it is flattened as 147 numbers into the MLP. That learned as well as
    one-hot encoding each cell's three categories (980 features) on
    BabyAI-GoToRedBallNoDists-v0, and in less time (docs/envs.md has the figures).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self._mission = isinstance(space, gym.spaces.Dict) and "mission" in space.spaces \
            and not isinstance(space["mission"], _PLAIN)
        if self._mission:
            parts = dict(space.spaces)
            parts["mission"] = gym.spaces.MultiBinary(len(MISSION_VOCAB) + 1)
            self.observation_space = gym.spaces.Dict(parts)

    def observation(self, obs: Any) -> Any:
        if self._mission:
            obs = {**obs, "mission": bag_of_words(obs["mission"])}
        return obs


# ---------------------------------------------------------------------------
# The flattening wrapper


class FlattenParts(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        check_observation_space(space, _env_label(env))
        if isinstance(space, gym.spaces.Dict):
            items = list(space.spaces.items())
        elif isinstance(space, gym.spaces.Tuple):
            items = [(str(i), s) for i, s in enumerate(space.spaces)]
        else:  # a Text or OneOf observation: one part
            items = [("obs", space)]
        self._keys = [k for k, _ in items]
        self._spaces = [s for _, s in items]
        # per part: the integer start to subtract (Discrete / MultiDiscrete), 0, or None for a
        # space Gymnasium flattens (Text, OneOf, a Dict in a Dict, ...)
        self._starts = []
        layout, start = [], 0
        for key, sub in items:
            if isinstance(sub, gym.spaces.OneOf):
                # which subspace (a category), then its value flattened and zero-padded
                n = int(gym.spaces.flatdim(sub))
                layout.append(Part(key, (), False, start, start + 1, True, (len(sub.spaces),)))
                layout.append(Part(f"{key}.value", (n - 1,), False, start + 1, start + n))
                self._starts.append(None)
                start += n
                continue
            if isinstance(sub, gym.spaces.Text):
                # one slot per character: its index in the charset, len(charset) for padding
                nvec = (len(sub.character_set) + 1,) * int(sub.max_length)
                layout.append(Part(key, (int(sub.max_length),), False, start, start + len(nvec), True, nvec))
                self._starts.append(None)
                start += len(nvec)
                continue
            nvec, offset = _categories(key, sub)
            n = len(nvec) if nvec else int(gym.spaces.flatdim(sub))
            onehot = isinstance(sub, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
            layout.append(Part(key, tuple(sub.shape or ()), _is_image(sub), start, start + n, onehot, nvec))
            plain = isinstance(sub, (gym.spaces.Box, gym.spaces.MultiBinary))
            self._starts.append(offset if offset is not None else 0 if plain else None)
            start += n
        box = gym.spaces.Box(-np.inf, np.inf, (start,), np.float32)
        box.corral_layout = layout  # travels with the space (pickles with its __dict__)
        attach_goal(env, box, _env_label(env))  # a GoalEnv's goal columns and compute_reward (HER)
        self.observation_space = box
        self._dict = isinstance(space, gym.spaces.Dict)
        self._single = not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))

    def observation(self, obs: Any) -> np.ndarray:
        parts = [obs] if self._single else [obs[k] for k in self._keys] if self._dict else list(obs)
        flat = []
        for space, p, s in zip(self._spaces, parts, self._starts):
            if s is None:
                flat.append(np.asarray(gym.spaces.flatten(space, p)).reshape(-1))
            else:  # integers as values (from 0), not one-hot
                a = np.asarray(p).reshape(-1)
                flat.append(a - s if isinstance(s, np.ndarray) and s.any() else a)
        return np.concatenate(flat, dtype=np.float32, casting="unsafe")


def flatten_parts(env: gym.Env) -> gym.Env:
    """Make ``env``'s observations something corral stores and encodes: MiniGrid / BabyAI envs
    re-encoded (:class:`MiniGridObs`), Dict / Tuple / Text / OneOf observations flattened
    (:class:`FlattenParts`); Graph, Sequence and unknown spaces refused with a ``UserError``.
    Box, Discrete, MultiDiscrete and MultiBinary observations are left as they are."""
    if _is_minigrid(env):
        env = MiniGridObs(env)
    space = env.observation_space
    if isinstance(space, _PLAIN):
        return env
    return FlattenParts(env)  # checks the space first


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
