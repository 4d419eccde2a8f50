"""Actors for off-policy algorithms: Q-networks (plain and dueling), deterministic and
squashed-Gaussian policies, and ensembles of Q(s, a) critics as one batched module."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from corral.actors.actor_critic import MultiInputEncoder
from corral.actors.normalizer import RunningNormalizer
from corral.envs.spaces import layout_of, legacy_columns
from corral.kernels.greedy import greedy_numpy
from corral.kernels.registry import register
from corral.nets import MLP, NatureCNN, OneHotEncoder, ParallelMLP, is_discrete_space, is_image_space


class ObsEncoder(nn.Module):
    """Normalizer + flatten: what every off-policy net sees first. Images go through a
    Nature CNN; Dict / Tuple observations with image parts through a CNN per part (their
    vector parts normalized, the image parts raw), as PPO's multi-input encoder does."""

    def __init__(self, obs_space: gym.spaces.Box, normalize: bool, allow_images: bool = True):
        super().__init__()
        self.shape = tuple(obs_space.shape)
        image = is_image_space(obs_space)
        if image and not allow_images:
            raise ValueError("image observations are not supported by this network")
        # integer observations (Discrete, MultiDiscrete, MultiBinary): one-hot here, never normalized
        self.onehot = OneHotEncoder(obs_space) if is_discrete_space(obs_space) else None
        self.norm = RunningNormalizer(self.shape, enabled=normalize and not image and self.onehot is None)
        self.cnn = NatureCNN(self.shape) if image else None
        self.dim = self.cnn.out_dim if image else int(math.prod(self.shape))
        if self.onehot is not None:
            self.dim = self.onehot.out_dim
        layout = layout_of(obs_space)
        parts = MultiInputEncoder(layout) if layout else None
        if layout:
            self.norm.legacy = legacy_columns(layout)
        # image parts through their CNNs, integer parts one-hot; image, flag and integer parts
        # skip the normalizer
        self.parts = parts if parts is not None and not parts.identity else None
        self.raw = parts is not None and bool(parts.raw_dims.any())
        if self.raw:
            self.register_buffer("raw_dims", parts.raw_dims, persistent=False)
        if self.parts is not None:
            self.dim = self.parts.out_dim
        # flat float observations pass through unchanged (no normalizer, one-hot, CNN or parts)
        self.identity = (len(self.shape) == 1 and np.issubdtype(obs_space.dtype, np.floating)
                         and not (self.norm.enabled or image or self.onehot is not None or parts is not None))

    @property
    def trainable(self) -> bool:
        """Whether it has weights of its own (a CNN): then critics get an encoder of their own."""
        return self.cnn is not None or (self.parts is not None and len(self.parts.cnns) > 0)

    def forward(self, obs: torch.Tensor, norm: RunningNormalizer | None = None) -> torch.Tensor:
        """``norm``: another normalizer to use (a target network's encoder takes the online
        one's, so targets never see observations scaled by statistics from the last copy)."""
        if self.cnn is not None:
            return self.cnn(obs)
        if self.onehot is not None:
            return self.onehot(obs)
        x = (norm if norm is not None else self.norm)(obs).flatten(1)
        if self.raw:
            x = torch.where(self.raw_dims, obs.flatten(1).float(), x)
        return self.parts(x) if self.parts is not None else x


class QNetwork(nn.Module):
    """Q(s, .) for Discrete actions; ``dueling`` splits it into V(s) + A(s, a) - mean_a A."""

    def __init__(self, obs_space, act_space: gym.spaces.Discrete, hidden=(256, 256), activation="relu",
                 dueling: bool = False, normalize_obs: bool = False):
        super().__init__()
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.n = int(act_space.n)
        self.dueling = dueling
        if dueling:
            self.body = MLP(self.enc.dim, hidden[:-1], activation)
            # value and advantage streams: two heads of the last hidden size, batched
            self.streams = ParallelMLP(2, self.body.out_dim, hidden[-1:], activation, out_dim=self.n)
        else:
            self.body = MLP(self.enc.dim, hidden, activation, out_dim=self.n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q-values from already-normalized flat observations."""
        h = self.body(x)
        if not self.dueling:
            return h
        out = self.streams(h)
        value, adv = out[0, :, :1], out[1]
        return value + adv - adv.mean(-1, keepdim=True)

    def q(self, obs: torch.Tensor, norm: RunningNormalizer | None = None) -> torch.Tensor:
        """Q-values from raw observations (through this network's own encoder; ``norm``
        replaces its normalizer, see ``ObsEncoder.forward``)."""
        return self(self.enc(obs, norm))

    def chain(self):
        """The net as one chain of linear layers for ``mlp_forward`` / ``mlp_backward``:
        ``(params, acts, activation)``, or None where it is not one (dueling streams, an
        encoder with weights of its own, an activation the chain does not write out)."""
        if self.dueling or self.enc.trainable or self.body.act_name not in ("relu", "tanh"):
            return None
        if type(self).forward is not QNetwork.forward or type(self).q is not QNetwork.q:
            return None  # a subclass's own forward: the kernels that run the chain would skip it
        plan = self.body._plan
        return tuple(t for w, b, _ in plan for t in (w, b)), [a is not None for *_, a in plan], self.body.act_name

    def greedy_numpy(self, obs: torch.Tensor):
        """``q(obs).argmax(-1)`` (as an array) for a few rows on CPU, through numpy, or None where
        the net is not a chain: the kernel ``corral.kernels.greedy.greedy_numpy`` (acting only)."""
        return greedy_numpy(self, obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        return self.q(obs).argmax(-1)


class ActionBox(nn.Module):
    """tanh-squashed unit actions <-> a Box's bounds (``low + (a + 1) / 2 * (high - low)``)."""

    def __init__(self, space: gym.spaces.Box):
        super().__init__()
        low = torch.tensor(space.low, dtype=torch.float32).flatten()  # a copy: spaces from Ray are read-only
        high = torch.tensor(space.high, dtype=torch.float32).flatten()
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError(f"continuous off-policy algorithms need finite action bounds, got {space}")
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.shape = tuple(space.shape)
        self.dim = low.numel()

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        return (self.low + (unit + 1.0) * 0.5 * (self.high - self.low)).reshape(unit.shape[0], *self.shape)

    def to_unit(self, env_action: torch.Tensor) -> torch.Tensor:
        a = env_action.reshape(env_action.shape[0], -1)
        return ((a - self.low) / (self.high - self.low) * 2.0 - 1.0).clamp(-1.0, 1.0)


class DeterministicActor(nn.Module):
    """mu(s) in [-1, 1] via tanh (DDPG, TD3)."""

    def __init__(self, obs_space, act_space: gym.spaces.Box, hidden=(256, 256), activation="relu",
                 normalize_obs: bool = False):
        super().__init__()
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.box = ActionBox(act_space)
        self.net = MLP(self.enc.dim, hidden, activation, out_dim=self.box.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(x))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        return self.box.to_env(self(self.enc(obs)))


LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor, log_prob: bool = True):
    """``(tanh(pre), log-prob or None, pre, std * noise)`` with ``pre = mean + std * noise``,
    ``std = exp(log_std)`` (log std clamped to [LOG_STD_MIN, LOG_STD_MAX])."""
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    spread = log_std.exp() * noise
    pre = mean + spread
    action = torch.tanh(pre)
    if not log_prob:
        return action, None, pre, spread
    # log N(pre) - sum log(1 - tanh^2), the latter in the stable form 2(log2 - pre - softplus(-2 pre))
    logp = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    logp = logp - (2.0 * (math.log(2.0) - pre - nn.functional.softplus(-2.0 * pre))).sum(-1)
    return action, logp, pre, spread


@register("squashed_gaussian", reference="corral.actors.offpolicy:squashed_sample", tolerance=1e-6,
          runs="the SAC family's actor loss (SquashedGaussianActor.squash with gradients flowing): values "
               "squashed_sample's own, the gradient in closed form")
class _Squash(torch.autograd.Function):
    """``squashed_sample`` from the network's output ``[mean, log_std]`` with its gradient in
    closed form: with ``a = tanh(pre)``, ``d a / d pre = 1 - a^2``, ``d logp / d pre = 2 a``
    (the derivative of ``-log(1 - tanh^2)``), ``d pre / d log_std = std * noise`` and
    ``d logp / d log_std = -1``, both through the clamp's pass-through mask. One autograd node
    instead of about fifteen; the values are ``squashed_sample``'s bit for bit, and
    ``tests/test_offpolicy.py`` checks the gradients against autograd's."""

    @staticmethod
    def forward(ctx, out, noise):
        mean, log_std = out.chunk(2, dim=-1)
        action, logp, _, spread = squashed_sample(mean, log_std, noise)
        inside = (log_std >= LOG_STD_MIN) & (log_std <= LOG_STD_MAX)
        ctx.save_for_backward(action, spread, inside)
        return action, logp

    @staticmethod
    def backward(ctx, g_action, g_logp):
        action, spread, inside = ctx.saved_tensors
        g_pre = torch.zeros_like(action) if g_action is None else g_action * (1.0 - action.square())
        if g_logp is not None:
            g_logp = g_logp.unsqueeze(-1)
            g_pre = g_pre + g_logp * 2.0 * action
        g_log_std = g_pre * spread
        if g_logp is not None:
            g_log_std = g_log_std - g_logp
        g_log_std = g_log_std * inside
        return torch.cat([g_pre, g_log_std], -1), None


class SquashedGaussianActor(nn.Module):
    """tanh(N(mu(s), sigma(s))) with the change-of-variables log-prob (SAC, Haarnoja et al. 2018, app. C)."""

    def __init__(self, obs_space, act_space: gym.spaces.Box, hidden=(256, 256), activation="relu",
                 normalize_obs: bool = False):
        super().__init__()
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.box = ActionBox(act_space)
        self.net = MLP(self.enc.dim, hidden, activation, out_dim=2 * self.box.dim)

    def forward(self, x: torch.Tensor, generator=None, deterministic: bool = False, noise=None,
                log_prob: bool = True):
        """(action in [-1, 1], log-prob); the standard normal draw is ``noise`` when given;
        ``log_prob=False`` (acting) skips the log-prob and returns None for it."""
        return self.squash(self.net.fused(x), generator, deterministic, noise, log_prob)

    def squash(self, out: torch.Tensor, generator=None, deterministic: bool = False, noise=None,
               log_prob: bool = True):
        """The action and its log-prob from the network's output (mean and log std)."""
        mean, log_std = out.chunk(2, dim=-1)
        if deterministic:
            return torch.tanh(mean), None
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        if log_prob and torch.is_grad_enabled() and out.requires_grad:
            return _Squash.apply(out, noise)  # the actor loss: one autograd node
        return squashed_sample(mean, log_std, noise, log_prob)[:2]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        return self.box.to_env(self(self.enc(obs), generator, deterministic, log_prob=False)[0])


class Critics(nn.Module):
    """``n`` independent Q(s, a) networks evaluated as one batched module -> ``[n, B]``.

    With ``obs_space`` the critics have an encoder of their own (its CNNs shared by the
    ``n`` heads, trained by the critic loss, as SB3's default for pixels) and see raw
    observations; otherwise they see the actor encoder's output (``view`` picks)."""

    def __init__(self, obs_dim: int, act_dim: int, n: int = 2, hidden=(256, 256), activation="relu",
                 obs_space: gym.spaces.Box | None = None, n_out: int = 1):
        super().__init__()
        self.n = n
        self.n_out = n_out  # > 1: each critic outputs that many values (TQC's quantiles), ``[n, B, n_out]``
        self.enc = ObsEncoder(obs_space, False) if obs_space is not None else None
        if self.enc is not None:
            obs_dim = self.enc.dim
        self.net = ParallelMLP(n, obs_dim + act_dim, hidden, activation, out_dim=n_out,
                               out_gains=tuple([1.0] * n))

    def view(self, raw: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """What ``forward`` takes: raw observations for an own encoder, else the actor encoder's output."""
        return raw if self.enc is not None else encoded

    def forward(self, x: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, B]`` (``[n, B, n_out]`` for several outputs); ``members``: only those critics."""
        if self.enc is not None:
            x = self.enc(x)
        out = self.net(torch.cat([x, action], dim=-1), members)
        return out.squeeze(-1) if self.n_out == 1 else out
