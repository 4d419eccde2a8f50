"""Encoders and heads. Networks only: no losses, no optimizers."""

from __future__ import annotations

import math

import torch
from torch import nn

# the fused paths live in corral/kernels/mlp.py; their names stay importable from here
from corral.kernels.mlp import (  # noqa: F401
    _FUSED_ACTS,
    _MLPFunction,
    _parallel_mlp_forward,
    _ParallelMLPFunction,
    fast_tanh_,
    mlp_backward,
    mlp_forward,
    plain_activations,
)
from corral.kernels.precision import autocast_low, baddbmm, linear, pixels_to_unit
from corral.nets.heads import CategoricalHead, DiagGaussianHead, MultiCategoricalHead  # noqa: F401

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
ACTIVATION_FNS = {"tanh": torch.tanh, "relu": torch.relu, "elu": nn.functional.elu, "silu": nn.functional.silu}
# In place on a linear layer's fresh output, where autograd allows it: relu's and tanh's backward
# read their output, not their input, and a linear layer's backward does not read its output.
_PLAN_FNS = {**ACTIVATION_FNS, "tanh": torch.tanh_, "relu": torch.relu_}


def activation(name: str) -> type[nn.Module]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}") from None


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal init (as in the PPO implementation details): keeps early updates well scaled."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class MLP(nn.Sequential):
    """Fully connected encoder: in_dim -> hidden... ; `out_dim` adds a final linear layer."""

    def __init__(
        self,
        in_dim: int,
        hidden: tuple[int, ...] | list[int],
        act: str = "tanh",
        out_dim: int | None = None,
        out_gain: float = 1.0,
        init: str = "orthogonal",
    ):
        # init "torch": nn.Linear's own (Kaiming-uniform) init, as SB3's DQN-family nets keep it
        keep = (lambda layer, gain=None: layer) if init == "torch" else layer_init
        layers: list[nn.Module] = []
        last = in_dim
        for h in hidden:
            layers += [keep(nn.Linear(last, h)), activation(act)()]
            last = h
        if out_dim is not None:
            layers.append(keep(nn.Linear(last, out_dim), gain=out_gain))
            last = out_dim
        super().__init__(*layers)
        self.out_dim = last
        # (weight, bias, activation function or None) per Linear: forward runs them as a plain
        # loop of F.linear, about a third less Python time than a module call per layer. The
        # Parameters are the modules' own objects, so .to(), load_state_dict(), FlatAdam's
        # views and deepcopy (the memo maps them to the copy's) all keep them in step.
        self.act_name = act
        self._plan = []
        for m in self:
            if isinstance(m, nn.Linear):
                self._plan.append([m.weight, m.bias, None])
            else:
                self._plan[-1][2] = _PLAN_FNS[act]  # in place: one allocation fewer a layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w, b, act in self._plan:
            x = linear(x, w, b)
            if act is not None:
                x = act(x)
        return x

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """``forward``'s values as one autograd node (``_MLPFunction``) when gradients flow
        and the activation is relu or tanh; otherwise ``forward``."""
        if self.act_name not in ("relu", "tanh") or not torch.is_grad_enabled() or x.dim() != 2:
            return self(x)
        params = [t for w, b, _ in self._plan for t in (w, b)]
        if not (x.requires_grad or any(p.requires_grad for p in params)):
            return self(x)
        acts = [act is not None for _, _, act in self._plan]
        return _MLPFunction.apply(x, self.act_name, acts, *params)


def is_image_space(space) -> bool:
    """uint8 Box with 3 dims, channels first (Atari after frame stacking: 4x84x84) or
    last (CarRacing: 96x96x3), with sides the Nature CNN takes (36 or more). A smaller
    uint8 array (a 7x7x3 grid) is a vector of numbers: flattened into the MLP."""
    import numpy as np

    from corral.envs.spaces import cnn_fits

    shape = getattr(space, "shape", None)
    return shape is not None and len(shape) == 3 and getattr(space, "dtype", None) == np.uint8 and cnn_fits(shape)


def is_discrete_space(space) -> bool:
    """Discrete, MultiDiscrete or MultiBinary: observations stored as integers and encoded
    (one-hot, or 0/1 floats) inside the network."""
    import gymnasium as gym

    return isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))


class OneHotEncoder(nn.Module):
    """Integer observations -> features, as Stable-Baselines3 encodes them: a Discrete one
    one-hot, a MultiDiscrete one as its one-hots concatenated, a MultiBinary one as 0/1
    floats. Storage keeps the integers (one per part, not one float per category); the
    one-hot is made here, once per forward pass (one ``scatter_``)."""

    def __init__(self, space):
        super().__init__()
        import gymnasium as gym
        import numpy as np

        self.binary = isinstance(space, gym.spaces.MultiBinary)
        self.shape = tuple(space.shape)
        if self.binary:
            self.out_dim = int(math.prod(self.shape))
            return
        if isinstance(space, gym.spaces.Discrete):
            sizes, starts = [int(space.n)], [int(space.start)]
        else:
            sizes = [int(n) for n in space.nvec.reshape(-1)]
            start = getattr(space, "start", None)
            starts = [int(v) for v in np.reshape(start, -1)] if start is not None else [0] * len(sizes)
        # part i's category c goes to column offset_i + c - start_i
        offsets = torch.tensor(np.cumsum([0] + sizes[:-1]) - np.array(starts), dtype=torch.long)
        self.register_buffer("offsets", offsets, persistent=False)
        self.out_dim = int(sum(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.binary:
            return x.reshape(x.shape[0], -1).float()
        idx = x.reshape(x.shape[0], -1).long() + self.offsets
        return torch.zeros(x.shape[0], self.out_dim, device=x.device).scatter_(1, idx, 1.0)


class NatureCNN(nn.Module):
    """The DQN Nature paper's encoder (Mnih et al. 2015): uint8 images in, scaled to
    [0, 1] inside the network, so storage stays uint8; 512 features out."""

    def __init__(self, shape: tuple[int, int, int], features: int = 512):
        super().__init__()
        # channels last (CarRacing's 96x96x3 RGB) is read as such and permuted inside
        self.channels_last = shape[-1] <= 4 < shape[0]
        if self.channels_last:
            shape = (shape[2], shape[0], shape[1])
        c = shape[0]
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, *shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, features), nn.ReLU())
        self.out_dim = features

    def orthogonal_(self, gain: float = math.sqrt(2)) -> NatureCNN:
        """Every convolution and the linear layer orthogonal with ``gain``, biases zero: SB3's
        ``ortho_init`` of a features extractor and CleanRL's ``layer_init`` (PyTorch's default
        initialisation otherwise)."""
        for layer in (*self.conv, *self.fc):
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                layer_init(layer, gain)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        with autocast_low(x.device.type):
            h = self.fc(self.conv(pixels_to_unit(x)))
        return h.float()  # bfloat16 features of a bfloat16 update back to float32 (a no-op otherwise)


INITS = ("orthogonal", "torch")  # ParallelMLP's initialisations (the on-policy actors' ``init`` option)


class ParallelMLP(nn.Module):
    """``n`` independent MLPs of one shape evaluated as one batched module.

    Used for actor + critic (n=2) and twin / ensemble critics: one ``baddbmm`` per
    layer instead of n small matmuls, so small nets cost about half the kernel
    launches. Input ``[B, in]`` (shared by all members) or ``[n, B, in]``;
    output ``[n, B, out]``.
    """

    def __init__(self, n: int, in_dim: int, hidden: tuple[int, ...] | list[int], act: str = "tanh",
                 out_dim: int | None = None, out_gains: tuple[float, ...] | None = None, init: str = "orthogonal"):
        """``init``: ``orthogonal`` (gain sqrt 2, ``out_gains`` on the last layer, zero biases) or
        ``torch`` (each member as a fresh ``nn.Linear``: PyTorch's default, SB3's ``ortho_init=False``)."""
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.n = n
        dims = [in_dim, *hidden] + ([out_dim] if out_dim is not None else [])
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = out_dim is not None and i == len(dims) - 2
            gains = out_gains if (last and out_gains) else [math.sqrt(2)] * n
            w = torch.empty(n, b, a)  # [n, out, in], nn.Linear's layout (MKL's small-output matmuls favour it)
            bias = torch.zeros(n, 1, b)
            for k in range(n):
                if init == "orthogonal":
                    nn.init.orthogonal_(w[k], gains[k])
                else:  # nn.Linear.reset_parameters, member by member
                    nn.init.kaiming_uniform_(w[k], a=math.sqrt(5))
                    nn.init.uniform_(bias[k], -1 / math.sqrt(a), 1 / math.sqrt(a))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(bias))
        activation(act)  # validates the name
        self.act = ACTIVATION_FNS[act]
        self.act_name = act
        self.has_out = out_dim is not None
        self.out_dim = dims[-1]
        # Plain list of (weight, bias): iterating a ParameterList costs microseconds per
        # item, which shows on the acting path. The Parameters themselves stay the same
        # objects through .to(), load_state_dict() and deepcopy.
        self._layers = list(zip(self.weights, self.biases))
        self._act_after = [i < len(self._layers) - 1 or not self.has_out for i in range(len(self._layers))]

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """``members``: indices of the members to evaluate (REDQ's target subset), ``[len(members), B, out]``."""
        if members is not None:
            params = [t[members] for wb in self._layers for t in wb]
            if x.dim() == 3:
                x = x[members]
            if self.act_name in _FUSED_ACTS and not torch.is_grad_enabled():
                return _parallel_mlp_forward(x, self.act_name, self._act_after, params)[0]
            if x.dim() == 2:
                x = x.unsqueeze(0).expand(len(members), *x.shape)
            for i, act in enumerate(self._act_after):
                x = baddbmm(params[2 * i + 1], x, params[2 * i].mT)
                if act:
                    x = self.act(x)
            return x
        if self.act_name in _FUSED_ACTS:
            params = [t for wb in self._layers for t in wb]
            if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
                return _ParallelMLPFunction.apply(x, self.act_name, self._act_after, *params)
            return _parallel_mlp_forward(x, self.act_name, self._act_after, params)[0]
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.n, *x.shape)
        for (w, b), act in zip(self._layers, self._act_after):
            x = baddbmm(b, x, w.mT)
            if act:
                x = self.act(x)
        return x


class NoisyLinear(nn.Module):
    """A linear layer with factorised Gaussian noise on its weights (Fortunato et al. 2018):
    ``w = mu_w + sigma_w * f(e_out) f(e_in)^T``, ``b = mu_b + sigma_b * f(e_out)`` with
    ``f(x) = sign(x) sqrt(|x|)`` and ``e_in``, ``e_out`` standard normal.

    The noise lives in two buffers that ``reset_noise(generator)`` redraws (the caller's
    stream, so acting and learning keep their own); ``noisy = False`` gives the mean
    weights (deterministic acting, evaluation). The forward pass never forms the noisy
    matrix: ``x W^T = x mu_w^T + ((x * f(e_in)) sigma_w^T) * f(e_out)``."""

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        # f(e_in), f(e_out): zero until the first reset_noise (the mean weights)
        self.register_buffer("noise_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("noise_out", torch.zeros(out_features), persistent=False)
        self.noisy = True

    @staticmethod
    def _f(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        dev = self.weight_mu.device
        self.noise_in.copy_(self._f(torch.randn(self.in_features, generator=generator, device=dev)))
        self.noise_out.copy_(self._f(torch.randn(self.out_features, generator=generator, device=dev)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight_mu, self.bias_mu)
        if not self.noisy:
            return y
        noise = nn.functional.linear(x * self.noise_in, self.weight_sigma) + self.bias_sigma
        return y + noise * self.noise_out


class NoisyMLP(nn.Sequential):
    """``MLP`` with every layer a ``NoisyLinear`` (Rainbow's heads)."""

    def __init__(self, in_dim: int, hidden, act: str = "relu", out_dim: int | None = None, sigma0: float = 0.5):
        layers: list[nn.Module] = []
        last = in_dim
        for h in list(hidden) + ([out_dim] if out_dim is not None else []):
            layers += [NoisyLinear(last, h, sigma0), activation(act)()]
            last = h
        if out_dim is not None:
            layers.pop()  # no activation after the output layer
        super().__init__(*layers)
        self.out_dim = last


def noisy_layers(module: nn.Module) -> list[NoisyLinear]:
    return [m for m in module.modules() if isinstance(m, NoisyLinear)]


def reset_noise(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """Redraw the noise of every ``NoisyLinear`` in ``module``, in module order."""
    for m in noisy_layers(module):
        m.reset_noise(generator)


class mean_weights:
    """``with mean_weights(net):`` its noisy layers use their mean weights (no noise)."""

    def __init__(self, module: nn.Module):
        self.layers = noisy_layers(module)

    def __enter__(self):
        self.saved = [m.noisy for m in self.layers]
        for m in self.layers:
            m.noisy = False
        return self

    def __exit__(self, *exc):
        for m, s in zip(self.layers, self.saved):
            m.noisy = s
        return False


# ---------------------------------------------------------------------------
# Recurrent cores


class RecurrentCore(nn.Module):
    """An LSTM or GRU (``layers`` deep) whose state is reset to zeros where an episode starts.

    The state of a batch is one tensor ``[B, state_dim]`` (an LSTM's ``h`` and ``c`` of every
    layer side by side, a GRU's ``h``), so rollouts, replay, fragments and checkpoints hold it
    like any other per-env column. ``starts[t, b]`` says that step ``t`` of column ``b`` is the
    first of an episode: the state entering that step is replaced by zeros first. That is
    where the *observation* starts a new episode, which is not always one step after a done
    flag (a fragment's boundary is marked truncated but continues its episode).

    ``forward(x [T, B, F], state, starts [T, B])`` runs whole sequences: one call of the
    cuDNN/MKL kernel per stretch of steps in which no column starts an episode (the state is
    reset between stretches), so it equals stepping one step at a time, and a batch of
    packed trajectories equals running each alone."""

    def __init__(self, in_dim: int, hidden: int, layers: int = 1, kind: str = "lstm"):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"recurrent core must be 'lstm' or 'gru', got {kind!r}")
        self.kind, self.hidden, self.layers = kind, int(hidden), int(layers)
        rnn = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn(in_dim, hidden, layers)
        for name, p in self.rnn.named_parameters():  # orthogonal weights, zero biases (SB3-contrib, CleanRL)
            if "weight" in name:
                nn.init.orthogonal_(p, 1.0)
            else:
                nn.init.zeros_(p)
        self.out_dim = self.hidden
        self.state_dim = self.hidden * self.layers * (2 if kind == "lstm" else 1)

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        """The state of a new episode: zeros."""
        return torch.zeros(batch, self.state_dim, device=device)

    def _unpack(self, state: torch.Tensor):
        B, L, H = state.shape[0], self.layers, self.hidden
        if self.kind == "gru":
            return state.view(B, L, H).transpose(0, 1).contiguous()
        hc = state.view(B, 2, L, H)
        return hc[:, 0].transpose(0, 1).contiguous(), hc[:, 1].transpose(0, 1).contiguous()

    def _pack(self, hx) -> torch.Tensor:
        if self.kind == "gru":
            return hx.transpose(0, 1).reshape(hx.shape[1], -1)
        h, c = hx
        return torch.stack([h.transpose(0, 1), c.transpose(0, 1)], 1).reshape(h.shape[1], -1)

    def step(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None):
        """One step for a batch: ``x [B, F]`` -> ``(out [B, H], new state)``."""
        out, state = self.forward(x.unsqueeze(0), state, None if starts is None else starts.unsqueeze(0))
        return out[0], state

    def forward(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None):
        """``x [T, B, F]``, ``state [B, D]`` entering step 0, ``starts [T, B]`` (bool or 0/1; None:
        none) -> ``(out [T, B, H], state after step T - 1)``."""
        T = x.shape[0]
        if starts is None:
            cut = [0]
        else:
            starts = starts.bool()
            any_start = starts.any(1)
            any_start[0] = True  # stretch boundaries: step 0 and every step where some column starts
            cut = any_start.nonzero().flatten().tolist()
        outs = []
        for i, t0 in enumerate(cut):
            t1 = cut[i + 1] if i + 1 < len(cut) else T
            if starts is not None:
                state = state * (~starts[t0]).unsqueeze(1).to(state.dtype)
            out, hx = self.rnn(x[t0:t1], self._unpack(state))
            state = self._pack(hx)
            outs.append(out)
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), state
