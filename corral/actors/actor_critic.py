"""Actor-critic for on-policy algorithms (PPO, A2C): policy and value networks plus
the observation normalizer, all in one ``state_dict``."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.envs.spaces import layout_of, legacy_columns
from corral.nets import (
    CategoricalHead,
    DiagGaussianHead,
    MultiCategoricalHead,
    NatureCNN,
    OneHotEncoder,
    ParallelMLP,
    is_discrete_space,
    is_image_space,
)


class ActionScaler(nn.Module):
    """Maps the policy's unit-space action to a Box's bounds.

    Finite bounds: ``low + (clip(a, -1, 1) + 1) / 2 * (high - low)``, so a unit
    Gaussian covers the whole range whatever its width. Infinite bounds: identity.
    """

    def __init__(self, space: gym.spaces.Box):
        super().__init__()
        low = torch.as_tensor(space.low, dtype=torch.float32)
        high = torch.as_tensor(space.high, dtype=torch.float32)
        self.bounded = bool(torch.isfinite(low).all() and torch.isfinite(high).all())
        self.register_buffer("low", torch.where(torch.isfinite(low), low, torch.zeros_like(low)))
        self.register_buffer("high", torch.where(torch.isfinite(high), high, torch.zeros_like(high)))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if not self.bounded:
            return a
        return self.low + (a.clamp(-1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)


class MultiInputEncoder(nn.Module):
    """Flat multi-part observations -> features: the non-image parts in layout order (a
    Discrete / MultiDiscrete part one-hot from its integer slots, the others as they are),
    then each image part through its own Nature CNN."""

    def __init__(self, layout, mask_key: str = "action_mask"):
        super().__init__()
        self.layout = list(layout)
        self.images = [p for p in self.layout if p.image]
        self.cnns = nn.ModuleList(NatureCNN(p.shape) for p in self.images)
        raw = torch.zeros(self.layout[-1].stop, dtype=torch.bool)
        # plain slots are copied from src to column dst; integer slot i sets column cat_off[i] + value
        src, dst, cat_src, cat_off, col = [], [], [], [], 0
        for p in self.layout:
            if p.image or p.key == mask_key or p.onehot:  # pixels, flags and integers are not normalized
                raw[p.start:p.stop] = True
            if p.image:
                continue
            if p.nvec:
                for i, n in enumerate(p.nvec):
                    cat_src.append(p.start + i)
                    cat_off.append(col)
                    col += n
            else:
                src.extend(range(p.start, p.stop))
                dst.extend(range(col, col + p.stop - p.start))
                col += p.stop - p.start
        self.identity = not self.images and not cat_src  # features are the flat vector itself
        for name, v in (("src", src), ("dst", dst), ("cat_src", cat_src), ("cat_off", cat_off)):
            self.register_buffer(name, torch.tensor(v, dtype=torch.long), persistent=False)
        self.raw_dims = raw
        self.vec_dim = col
        self.out_dim = col + sum(c.out_dim for c in self.cnns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return x
        feats = []
        if self.vec_dim:
            if self.cat_src.numel():  # the one-hot, once, from the stored integers
                vec = x.new_zeros(x.shape[0], self.vec_dim)
                vec.scatter_(1, x.index_select(1, self.cat_src).long() + self.cat_off, 1.0)
                vec.index_copy_(1, self.dst, x.index_select(1, self.src))
            else:
                vec = x.index_select(1, self.src)
            feats.append(vec)
        for p, cnn in zip(self.images, self.cnns):
            feats.append(cnn(x[:, p.start:p.stop].reshape(-1, *p.shape)))
        return torch.cat(feats, dim=-1) if len(feats) > 1 else feats[0]


class ActorCritic(nn.Module):
    def __init__(
        self,
        obs_space: gym.spaces.Box,
        act_space: gym.Space,
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        normalize_obs: bool = True,
        log_std_init: float = 0.0,
        mask_key: str = "action_mask",
        extractor: nn.Module | None = None,
        init: str = "orthogonal",
    ):
        super().__init__()
        self.init = init  # the body's initialisation (``ParallelMLP``'s ``init``), read by make_body
        self.obs_shape = tuple(obs_space.shape)
        # Images go through a shared Nature CNN (scaled inside, stored as uint8); vectors
        # through the running normalizer, then separate policy and value MLPs.
        self.image = is_image_space(obs_space)
        # Discrete / MultiDiscrete / MultiBinary observations are stored as integers and
        # one-hot encoded inside (OneHotEncoder); never normalized
        self.onehot = OneHotEncoder(obs_space) if is_discrete_space(obs_space) else None
        self.raw_obs = self.image or self.onehot is not None  # what rollouts store as the env gave it
        self.obs_norm = RunningNormalizer(self.obs_shape, enabled=normalize_obs and not self.raw_obs)
        self.cnn = NatureCNN(self.obs_shape) if self.image and extractor is None else None
        in_dim = self.cnn.out_dim if self.cnn is not None else int(math.prod(self.obs_shape))
        if self.onehot is not None:
            in_dim = self.onehot.out_dim
        # Dict / Tuple observations arrive flat with a layout (corral.envs.spaces): image parts
        # go through their own CNN, an "action_mask" part masks a Discrete policy, and both
        # stay raw (not normalized) in what rollouts store.
        self.parts = MultiInputEncoder(layout_of(obs_space), mask_key) if layout_of(obs_space) else None
        self.mask_slice = None
        if self.parts is not None:
            in_dim = self.parts.out_dim
            self.register_buffer("raw_dims", self.parts.raw_dims, persistent=False)
            self.obs_norm.legacy = legacy_columns(self.parts.layout)
            mask = next((p for p in self.parts.layout if p.key == mask_key), None)
            if mask is not None:
                if not isinstance(act_space, gym.spaces.Discrete) or mask.stop - mask.start != int(act_space.n):
                    raise ValueError(f"observation part {mask_key!r} must hold one 0/1 flag per Discrete action "
                                     f"({act_space}), it has {mask.stop - mask.start}")
                self.mask_slice = slice(mask.start, mask.stop)
        self.discrete = isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        if isinstance(act_space, gym.spaces.Discrete):
            pi_out = int(act_space.n)
            self.head = CategoricalHead()
            self.scaler = None
        elif isinstance(act_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            nvec = act_space.nvec.reshape(-1).tolist() if isinstance(act_space, gym.spaces.MultiDiscrete) \
                else [2] * int(math.prod(act_space.shape))
            pi_out = int(sum(nvec))
            self.head = MultiCategoricalHead(nvec)
            self.scaler = None
        elif isinstance(act_space, gym.spaces.Box):
            pi_out = int(math.prod(act_space.shape))
            self.head = DiagGaussianHead(pi_out, log_std_init)
            self.scaler = ActionScaler(act_space)
        else:
            raise ValueError(f"ActorCritic supports Discrete, MultiDiscrete, MultiBinary and Box actions, got {act_space}")
        self.act_shape = tuple(act_space.shape)
        # a user's feature extractor takes what rollouts store (normalized vectors, raw images)
        self.extractor = extractor
        if extractor is not None:
            in_dim = int(extractor.out_dim)
        if init == "orthogonal":
            # SB3's ortho_init and CleanRL's layer_init: the image encoders' layers orthogonal with
            # gain sqrt(2), biases zero, as the body's hidden layers (vector observations have none)
            for cnn in (m for m in self.modules() if isinstance(m, NatureCNN)):
                cnn.orthogonal_(math.sqrt(2))
        self.body = self.make_body(in_dim, tuple(hidden), activation, pi_out)

    def make_body(self, in_dim: int, hidden: tuple[int, ...], activation: str, pi_out: int) -> nn.Module:
        """Features -> ``[2, B, out]``: member 0 the policy (logits / mean, small init so the first
        policy is near uniform), member 1 the value (column 0). Separate weights, one batched
        module. (The recurrent actor puts its core in front of this.)"""
        return ParallelMLP(2, in_dim, hidden, activation, out_dim=pi_out, out_gains=(0.01, 1.0), init=self.init)

    # --- pieces the algorithm uses on stored (already normalized) observations
    def normalize(self, obs: torch.Tensor, update: bool = False) -> torch.Tensor:
        """What rollouts store: normalized flat vectors, or raw uint8 images and integer observations."""
        if self.raw_obs:
            return obs
        if update:
            self.obs_norm.update(obs)
        x = self.obs_norm(obs).flatten(1)
        if self.parts is not None:
            x = torch.where(self.raw_dims, obs.flatten(1).float(), x)
        return x

    def stored_action(self) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one sampled (policy-space) action as rollouts store it."""
        if isinstance(self.head, CategoricalHead):
            return (), torch.long
        if isinstance(self.head, MultiCategoricalHead):
            return (len(self.head.nvec),), torch.long
        return (int(self.head.log_std.numel()),), torch.float32

    def stored_obs(self) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one stored observation (see ``normalize``)."""
        if self.image:
            return self.obs_shape, torch.uint8
        if self.onehot is not None:  # integers, not one float per category
            return self.obs_shape, torch.uint8 if self.onehot.binary else torch.long
        return (int(math.prod(self.obs_shape)),), torch.float32

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's output for stored observations ``[B, ...]``: CNN, one-hot, the parts of
        a Dict / Tuple, or the flat vector itself."""
        if self.extractor is not None:
            return self.extractor(x)
        if self.cnn is not None:
            return self.cnn(x)
        if self.onehot is not None:
            return self.onehot(x)
        return self.parts(x) if self.parts is not None else x

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy net's raw output (masked logits / mean) and the value."""
        return self.heads(x, self.features(x))

    def heads(self, x: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked logits / mean and value from ``features`` (``x``: the stored observations, for the action mask)."""
        out = self.body(features)
        logits = out[0]
        if self.mask_slice is not None:  # invalid actions get (numerically) zero probability
            logits = logits.masked_fill(x[:, self.mask_slice] < 0.5, -1e8)
        return logits, out[1, :, 0]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters and value for normalized observations."""
        logits, value = self.outputs(x)
        return self.head(logits), value

    def dist_params(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)[0]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)[1]

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor):
        params, value = self.forward(x)
        return self.head.log_prob(params, action), self.head.entropy(params), value

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return action.reshape(action.shape[0], *self.act_shape)
        return self.scaler(action).reshape(action.shape[0], *self.act_shape)

    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Sample for training: (env_action, action, log_prob, value, normalized obs).
        Called under ``torch.no_grad()`` by the Learner (no decorator: it is the hot path)."""
        x = self.normalize(obs, update=True)
        params, value = self.forward(x)
        action = self.head.sample(params, generator)
        return self.to_env(action), action, self.head.log_prob(params, action), value, x

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """Env actions for a batch of raw observations; never updates the normalizer."""
        x = self.normalize(obs)
        params = self.dist_params(x)
        action = self.head.mode(params) if deterministic else self.head.sample(params, generator)
        return self.to_env(action)
