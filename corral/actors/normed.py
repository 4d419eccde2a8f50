"""Networks with normalisation layers for the SAC variants: batch renormalisation (CrossQ,
Bhatt et al. 2024, after Ioffe 2017) and dropout + layer norm critics (DroQ, Hiraoka et al.
2022). Like ``Critics``, an ensemble of ``n`` critics is one batched module (stacked weights,
one ``baddbmm`` per layer), never a Python loop over nets.

Train / eval mode is an argument of ``forward`` (``train=True`` only inside a gradient
step), not ``nn.Module.training``: a module is in training mode by default, so a flag would
leave acting and evaluation normalising with batch statistics (and moving the running ones)
unless every caller remembered to switch it."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from corral.actors.offpolicy import ActionBox, ObsEncoder, SquashedGaussianActor
from corral.kernels import precision
from corral.nets import ACTIVATION_FNS


class BatchRenorm(nn.Module):
    """Batch renormalisation (Ioffe 2017, "Batch Renormalization") over the batch dimension
    (``-2``) of ``[B, F]`` or, with ``members``, ``[n, B, F]`` (each member its own
    statistics and affine parameters).

    Train mode: ``x_hat = (x - mu_B) / sigma_B * r + d`` with ``sigma_B = sqrt(var_B + eps)``
    (the biased batch variance), ``r = clip(sigma_B / sigma_R, 1/r_max, r_max)`` and
    ``d = clip((mu_B - mu_R) / sigma_R, -d_max, d_max)``, both without gradient; for the first
    ``warmup`` training forwards ``r = 1, d = 0`` (plain batch norm). Then the running
    statistics move: ``mu_R += momentum (mu_B - mu_R)``, ``var_R += momentum (var_B' - var_R)``
    with the unbiased ``var_B'`` (as torch's BatchNorm). Eval mode: ``(x - mu_R) / sigma_R``,
    nothing updated. Both end with ``weight * x_hat + bias``."""

    def __init__(self, features: int, members: int | None = None, momentum: float = 0.01, eps: float = 1e-3,
                 warmup: int = 100_000, r_max: float = 3.0, d_max: float = 5.0):
        super().__init__()
        shape = (features,) if members is None else (members, 1, features)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.momentum, self.eps, self.warmup, self.r_max, self.d_max = momentum, eps, warmup, r_max, d_max

    def forward(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        # The formula's per-feature factors are folded into one scale and shift (small
        # tensors), so the batch-sized work is a subtraction, a square, a mean and one addcmul.
        if not train:
            scale = torch.rsqrt(self.running_var + self.eps) * self.weight
            return torch.addcmul(self.bias - self.running_mean * scale, x, scale)
        n = x.shape[-2]
        mean = x.mean(-2, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(-2, keepdim=True)  # biased, as the formula's sigma_B
        std = (var + self.eps).sqrt()
        with torch.no_grad():
            running_std = (self.running_var + self.eps).sqrt()
            on = self.steps >= self.warmup  # a tensor: no host read per forward
            r = torch.where(on, (std / running_std).clamp(1 / self.r_max, self.r_max), 1.0)
            d = torch.where(on, ((mean - self.running_mean) / running_std).clamp(-self.d_max, self.d_max), 0.0)
            self.running_mean.lerp_(mean.reshape(self.running_mean.shape), self.momentum)
            self.running_var.lerp_((var * (n / max(n - 1, 1))).reshape(self.running_var.shape), self.momentum)
            self.steps += 1
        # (xc / std * r + d) * weight + bias
        scale = r / std * self.weight
        return torch.addcmul(d * self.weight + self.bias, xc, scale)


def _linear_init(w: torch.Tensor, b: torch.Tensor) -> None:
    """nn.Linear's default initialisation, per member (what sb3-contrib's CrossQ nets get)."""
    for k in range(w.shape[0]):
        nn.init.kaiming_uniform_(w[k], a=math.sqrt(5))
        bound = 1 / math.sqrt(w.shape[-1])
        nn.init.uniform_(b[k], -bound, bound)


class RenormMLP(nn.Module):
    """CrossQ's MLP: a batch renorm before every linear layer (sb3-contrib's layout:
    BRN, Linear, act, ..., BRN, Linear out). ``members``: ``n`` MLPs batched, input ``[B, in]``
    (shared) or ``[n, B, in]``, output ``[n, B, out]``; else ``[B, out]``."""

    def __init__(self, in_dim: int, hidden, out_dim: int, activation: str = "relu", members: int | None = None,
                 **renorm):
        super().__init__()
        dims = [in_dim, *hidden, out_dim]
        self.members = members
        self.norms = nn.ModuleList(BatchRenorm(d, members, **renorm) for d in dims[:-1])
        n = members or 1
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(dims[:-1], dims[1:]):
            w, bias = torch.empty(n, b, a), torch.empty(n, 1, b)
            _linear_init(w, bias)
            if members is None:
                w, bias = w[0], bias[0, 0]
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(bias))
        self.act = ACTIVATION_FNS[activation]
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        if self.members is not None and x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, *x.shape)
        last = len(self.norms) - 1
        for i, (norm, w, b) in enumerate(zip(self.norms, self.weights, self.biases)):
            x = norm(x, train)
            # the update's precision for wide layers (corral.kernels.precision; float32: these calls as they read)
            x = precision.baddbmm(b, x, w.mT) if self.members is not None else precision.linear(x, w, b)
            if i < last:
                x = self.act(x)
        return x


class RenormCritics(nn.Module):
    """``n`` CrossQ critics Q(s, a) as one batched module -> ``[n, B]``, on the actor's features."""

    def __init__(self, obs_dim: int, act_dim: int, n: int = 2, hidden=(256, 256), activation="relu", **renorm):
        super().__init__()
        self.n = n
        self.enc = None
        self.net = RenormMLP(obs_dim + act_dim, hidden, 1, activation, members=n, **renorm)

    def view(self, raw: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        return encoded

    def forward(self, x: torch.Tensor, action: torch.Tensor, train: bool = False) -> torch.Tensor:
        return self.net(torch.cat([x, action], dim=-1), train).squeeze(-1)


class RenormSquashedGaussianActor(SquashedGaussianActor):
    """SAC's squashed Gaussian policy on a RenormMLP (CrossQ). ``act`` and ``explore``
    normalise with the running statistics (eval mode); only the actor loss trains them."""

    def __init__(self, obs_space, act_space: gym.spaces.Box, hidden=(256, 256), activation="relu",
                 normalize_obs: bool = False, **renorm):
        nn.Module.__init__(self)
        self.enc = ObsEncoder(obs_space, normalize_obs, allow_images=False)
        self.box = ActionBox(act_space)
        self.net = RenormMLP(self.enc.dim, hidden, 2 * self.box.dim, activation, **renorm)

    def forward(self, x: torch.Tensor, generator=None, deterministic: bool = False, noise=None,
                log_prob: bool = True, train: bool = False):
        return self.squash(self.net(x, train), generator, deterministic, noise, log_prob)


class DropoutCritics(nn.Module):
    """``n`` DroQ critics as one batched module -> ``[n, B]``: each hidden layer is
    Linear, dropout, layer norm (per-member affine), activation (Hiraoka et al. 2022, fig. 2).

    The dropout masks are arguments (``masks``: one ``[B, n, H]`` tensor per hidden layer,
    already scaled by ``1 / (1 - p)``), drawn by the algorithm from its noise stream: so a
    step is reproducible, resumable, and gradient workers get their rows' masks."""

    def __init__(self, obs_dim: int, act_dim: int, n: int = 2, hidden=(256, 256), activation="relu",
                 layer_norm: bool = True, obs_space: gym.spaces.Box | None = None):
        super().__init__()
        self.n = n
        self.hidden = tuple(hidden)
        self.enc = ObsEncoder(obs_space, False) if obs_space is not None else None
        if self.enc is not None:
            obs_dim = self.enc.dim
        dims = [obs_dim + act_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            w = torch.empty(n, b, a)
            for k in range(n):  # as Critics: orthogonal, gain sqrt(2) hidden, 1 out
                nn.init.orthogonal_(w[k], 1.0 if i == len(dims) - 2 else math.sqrt(2))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(n, 1, b)))
        self.ln_weights = nn.ParameterList(nn.Parameter(torch.ones(n, 1, h)) for h in hidden) if layer_norm else None
        self.ln_biases = nn.ParameterList(nn.Parameter(torch.zeros(n, 1, h)) for h in hidden) if layer_norm else None
        self.act = ACTIVATION_FNS[activation]

    def view(self, raw: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        return raw if self.enc is not None else encoded

    def forward(self, x: torch.Tensor, action: torch.Tensor, masks=None) -> torch.Tensor:
        if self.enc is not None:
            x = self.enc(x)
        x = torch.cat([x, action], dim=-1)
        x = x.unsqueeze(0).expand(self.n, *x.shape)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = precision.baddbmm(b, x, w.mT)  # the update's precision for wide layers
            if i == len(self.hidden):
                break
            if masks is not None:
                x = x * masks[i].transpose(0, 1)
            if self.ln_weights is not None:
                x = F.layer_norm(x, x.shape[-1:]) * self.ln_weights[i] + self.ln_biases[i]
            x = self.act(x)
        return x.squeeze(-1)
