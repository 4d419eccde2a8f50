"""Value networks with ``K`` outputs per action: categorical atoms (C51), quantiles
(QR-DQN), quantiles at sampled fractions (IQN), or one value with noisy layers (Noisy DQN).

All of them share ``QNetwork``'s interface -- ``q(obs, norm=None) -> [B, A]`` and
``act(obs)`` -- so epsilon-greedy acting, evaluation and Ape-X collectors read them
unchanged; the losses read ``out(obs) -> [B, A, K]`` (IQN: ``quantiles(obs, taus)``).

Layout: the encoder (``ObsEncoder``: normalizer, one-hot, Nature CNN), a torso of the
hidden layers but the last, then the head -- one stream, or value and advantage streams
combined per output as ``V + A - mean_a A`` (dueling; on the logits for C51, as Rainbow).
With ``noisy`` every layer after the encoder is a ``NoisyLinear``; ``act`` and
deterministic evaluation use the mean weights."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from corral.actors.normalizer import RunningNormalizer
from corral.actors.offpolicy import ObsEncoder
from corral.kernels.greedy import greedy_numpy
from corral.nets import MLP, NoisyMLP, mean_weights, reset_noise


def _stack(in_dim: int, hidden, act: str, out_dim: int | None, noisy: bool, sigma0: float,
           init: str = "orthogonal") -> nn.Module:
    if noisy:
        return NoisyMLP(in_dim, hidden, act, out_dim, sigma0)
    return MLP(in_dim, hidden, act, out_dim=out_dim, init=init)


def _run(stack: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A stack's forward; a plain MLP's as one autograd node when gradients flow (``MLP.fused``)."""
    return stack.fused(x) if isinstance(stack, MLP) else stack(x)


class ZNetwork(nn.Module):
    """Encoder, torso and a (dueling) head with ``K`` outputs per action: ``[B, A, K]``."""

    def __init__(self, obs_space, n_actions: int, k: int, hidden=(256, 256), activation="relu",
                 dueling: bool = False, noisy: bool = False, sigma0: float = 0.5, normalize_obs: bool = False,
                 init: str = "orthogonal"):
        super().__init__()
        self.enc = ObsEncoder(obs_space, normalize_obs)
        self.n, self.k, self.dueling = n_actions, k, dueling
        hidden = tuple(hidden)
        self.torso = _stack(self.enc.dim, hidden[:-1], activation, None, noisy, sigma0, init)
        width = self.torso.out_dim
        head_hidden = hidden[-1:]
        self.adv = _stack(width, head_hidden, activation, n_actions * k, noisy, sigma0, init)
        self.value = _stack(width, head_hidden, activation, k, noisy, sigma0, init) if dueling else None

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Torso features ``[..., d]`` -> ``[..., A, K]``."""
        adv = _run(self.adv, h).unflatten(-1, (self.n, self.k))
        if self.value is None:
            return adv
        return self.value(h).unsqueeze(-2) + adv - adv.mean(-2, keepdim=True)

    def out(self, obs: torch.Tensor, norm: RunningNormalizer | None = None) -> torch.Tensor:
        """Raw outputs ``[B, A, K]`` from raw observations (``norm``: see ``ObsEncoder.forward``)."""
        return self.head(_run(self.torso, self.enc(obs, norm)))

    def chain(self):
        """The net as one chain of linear layers, torso then head, for ``mlp_forward`` /
        ``mlp_backward``: ``(params, acts, activation)`` -- or None where it is not one
        (dueling streams, noisy layers, an encoder with weights of its own)."""
        stacks = (self.torso, self.adv)
        if self.dueling or self.enc.trainable or any(type(s) is not MLP for s in stacks):
            return None
        if type(self).out is not ZNetwork.out or type(self).head is not ZNetwork.head:
            return None  # a subclass's own forward: the kernels that run the chain would skip it
        act = self.torso.act_name
        if act not in ("relu", "tanh") or self.adv.act_name != act:
            return None
        plan = self.torso._plan + self.adv._plan
        return tuple(t for w, b, _ in plan for t in (w, b)), [a is not None for *_, a in plan], act

    def greedy_numpy(self, obs: torch.Tensor) -> np.ndarray | None:
        """``q(obs).argmax(-1)`` (as an array) for a few rows on CPU, through numpy, or None
        where the net is not a chain: the kernel ``corral.kernels.greedy.greedy_numpy``. For
        acting only: values may differ from ``q``'s in the last bits (another BLAS), so may
        exact ties."""
        return greedy_numpy(self, obs)

    def expectation_numpy(self, out: np.ndarray) -> np.ndarray:
        """``expectation`` on a numpy array."""
        return out[..., 0]

    def expectation(self, out: torch.Tensor) -> torch.Tensor:
        """``[..., A, K]`` outputs -> ``[..., A]`` Q-values."""
        return out.squeeze(-1)

    def q(self, obs: torch.Tensor, norm: RunningNormalizer | None = None) -> torch.Tensor:
        return self.expectation(self.out(obs, norm))

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        reset_noise(self, generator)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator=None) -> torch.Tensor:
        """Greedy actions; the mean weights when ``deterministic``, else one noise draw."""
        if not deterministic:
            self.reset_noise(generator)
            return self.q(obs).argmax(-1)
        with mean_weights(self):
            return self.q(obs).argmax(-1)


class CategoricalQNetwork(ZNetwork):
    """C51 (Bellemare et al. 2017): logits over ``K`` atoms evenly spaced in [v_min, v_max]."""

    def __init__(self, obs_space, n_actions: int, n_atoms: int, v_min: float, v_max: float, **kw):
        super().__init__(obs_space, n_actions, n_atoms, **kw)
        self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms), persistent=False)

    def expectation(self, out: torch.Tensor) -> torch.Tensor:
        return (out.softmax(-1) * self.support).sum(-1)

    def expectation_numpy(self, out: np.ndarray) -> np.ndarray:
        p = np.exp(out - out.max(-1, keepdims=True))
        return (p * self.support.numpy()).sum(-1) / p.sum(-1)


class QuantileQNetwork(ZNetwork):
    """QR-DQN (Dabney et al. 2018a): ``K`` quantiles at fractions ``(2i + 1) / 2K``; Q is their mean."""

    def expectation(self, out: torch.Tensor) -> torch.Tensor:
        return out.mean(-1)

    def expectation_numpy(self, out: np.ndarray) -> np.ndarray:
        return out.sum(-1) / out.shape[-1]  # np.mean's Python wrapper costs more than the sum


def cvar(taus: torch.Tensor, eta: float) -> torch.Tensor:
    """The CVaR distortion of IQN's paper: fractions in [0, eta] (risk-averse for eta < 1)."""
    return taus * eta


class ImplicitQNetwork(ZNetwork):
    """IQN (Dabney et al. 2018b): quantiles at any fractions ``tau``. The torso's features
    ``phi(s)`` are multiplied elementwise by an embedding of each tau,
    ``psi(tau) = ReLU(W [cos(pi i tau)]_{i<n_cos} + b)``, and the head maps each product to
    the ``A`` actions' quantile values at that tau."""

    def __init__(self, obs_space, n_actions: int, n_cos: int = 64, n_action_taus: int = 32, risk_eta: float = 1.0,
                 hidden=(256, 256), activation="relu", **kw):
        hidden = tuple(hidden)
        if len(hidden) < 2:  # phi(s) needs a hidden layer of its own before the head
            hidden = hidden + hidden
        super().__init__(obs_space, n_actions, 1, hidden, activation, **kw)
        self.n_action_taus, self.risk_eta = n_action_taus, risk_eta
        self.register_buffer("cos_freq", math.pi * torch.arange(n_cos, dtype=torch.float32), persistent=False)
        self.embed = nn.Sequential(nn.Linear(n_cos, self.torso.out_dim), nn.ReLU())

    def chain(self):
        return None  # the fraction embedding multiplies in between torso and head

    def embedding(self, taus: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` fractions -> ``[B, N, d]``."""
        return self.embed(torch.cos(taus.unsqueeze(-1) * self.cos_freq))

    def quantiles(self, obs: torch.Tensor, taus: torch.Tensor, norm: RunningNormalizer | None = None) -> torch.Tensor:
        """Quantile values ``[B, N, A]`` at fractions ``taus`` ``[B, N]``."""
        phi = self.torso(self.enc(obs, norm))
        return self.head(phi.unsqueeze(1) * self.embedding(taus)).squeeze(-1)

    def acting_taus(self, batch: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
        """The ``K`` fractions a greedy policy averages over, distorted: sampled from
        ``generator``, or, without one, the midpoints ``(i + 0.5) / K`` (deterministic)."""
        K = self.n_action_taus
        if generator is None:
            taus = ((torch.arange(K, device=device, dtype=torch.float32) + 0.5) / K).expand(batch, K)
        else:
            taus = torch.rand(batch, K, generator=generator, device=device)
        return cvar(taus, self.risk_eta)

    def q(self, obs: torch.Tensor, norm: RunningNormalizer | None = None, taus: torch.Tensor | None = None,
          generator: torch.Generator | None = None) -> torch.Tensor:
        if taus is None:
            taus = self.acting_taus(obs.shape[0], obs.device, generator)
        return self.quantiles(obs, taus, norm).mean(1)
