"""FlatAdam: Adam (Kingma & Ba 2015) with global-norm gradient clipping over one flat buffer.

Small RL networks spend more time in per-tensor optimizer overhead than in the
arithmetic: for a 64x64 actor-critic on a CPU, most of what ``torch.optim.Adam`` plus
``clip_grad_norm_`` cost is Python and per-tensor dispatch (docs/ledger.md, FlatAdam).
Here every parameter (and its ``.grad``) is a view into one flat tensor, so
zeroing, clipping and the Adam update are a few whole-buffer ops (the update itself
PyTorch's fused Adam kernel where this torch has one), whatever the number of layers. The math is exactly Adam's (PyTorch's default
``amsgrad=False``, no weight decay); ``tests/test_optim.py`` checks it against
``torch.optim.Adam`` step by step.

Build it after the module is on its device: ``.to()`` would replace the views.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch

# torch._fused_adam_ runs on CPU and CUDA from torch 2.4; older versions take the op-by-op path.
_FUSED = hasattr(torch, "_fused_adam_") and tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)

_TINY, _ONE = 5e-324, 1.0  # the smallest subnormal double, and a variable 1 (no constant folding)


def denormals_flushed() -> bool:
    """Whether this thread's floating-point unit already flushes subnormals to zero (x86's
    FTZ/DAZ, ARM's FZ): they apply to Python's float arithmetic too, so one multiply tells."""
    return _TINY * _ONE == 0.0


class FlatAdam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, max_grad_norm: float | None = None, flush_denormal: bool = True):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("FlatAdam got no trainable parameters")
        device, dtype = self.params[0].device, self.params[0].dtype
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params]).to(device, dtype)
        self.grad = torch.zeros_like(self.flat)
        self._bind()
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self._step_t = torch.zeros((), dtype=torch.float32, device=device)
        self.lr, self.betas, self.eps, self.max_grad_norm = lr, tuple(betas), eps, max_grad_norm
        # Subnormal moments (the squared gradients of units that barely learn decay into them)
        # take the CPU's slow path: QR-DQN's CartPole preset spent ~62 us an Adam step instead
        # of ~33 (the same buffer size, normal values) after a few thousand steps. Flushed to zero during the
        # step, as TensorFlow and XLA do on CPU by default. A subnormal moment's share of an
        # update is below float32's resolution of any parameter above ~1e-30, so the steps are
        # Adam's; the flag is this thread's, set and restored around the kernel.
        self.flush_denormal = flush_denormal and device.type == "cpu"
        self.steps = 0
        # Capturable (``corral.algos.graphed``): the step count lives only in ``_step_t`` on the
        # device, counted there, so a CUDA graph of the step replays it; ``steps`` is then stale
        # and ``step_count`` reads the tensor. The fused kernel reads the same float32 count
        # either way, so the two modes step bit for bit alike.
        self.capturable = False

    def _bind(self) -> None:
        """Make every parameter a view of ``flat`` and its ``.grad`` a view of ``grad``."""
        offset = 0
        for p in self.params:
            n = p.numel()
            p.data = self.flat[offset:offset + n].view_as(p)
            # A defined .grad is accumulated into in place by backward(), so every
            # gradient lands in self.grad.
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        # the same views, kept here too: a step that writes every one of them (``out=``) needs
        # no zero_grad, and module.zero_grad(set_to_none=True) cannot take them away
        self.grad_views = [p.grad for p in self.params]

    def __deepcopy__(self, memo: dict) -> FlatAdam:
        """A copy whose parameters (the copies ``memo`` holds, the same objects as the copied
        module's) are views of the copy's own buffers. ``Parameter.__deepcopy__`` clones each
        parameter's data on its own, so without this the copy's optimizer would step a buffer
        that no parameter reads: a deep-copied algorithm would silently stop learning."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        new._bind()
        return new

    @property
    def param_groups(self) -> list[dict]:
        """A view shaped like torch.optim's, so schedules can set ``group['lr']``."""
        return [self]

    def __setitem__(self, key, value):
        setattr(self, key, value)

    def __getitem__(self, key):
        return getattr(self, key)

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.grad.zero_()  # never None: backward must keep writing into the flat buffer
        if self.params[0].grad is None:  # someone called module.zero_grad(): re-attach the views
            offset = 0
            for p in self.params:
                p.grad = self.grad[offset:offset + p.numel()].view_as(p)
                offset += p.numel()

    def clip_grad_norm(self) -> torch.Tensor | None:
        """Scale the flat gradient to at most ``max_grad_norm`` (if set); the pre-clip norm."""
        if self.max_grad_norm is None:
            return None
        norm = self.grad.norm()
        self.grad.mul_((self.max_grad_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm

    @torch.no_grad()
    def step(self) -> torch.Tensor | None:
        """Clip (if configured) and apply one Adam step; returns the pre-clip grad norm."""
        b1, b2 = self.betas
        if _FUSED:
            # PyTorch's fused Adam kernel (what torch.optim.Adam(fused=True) calls): the same
            # update in one pass over the flat buffers instead of about six. Clipping rides in
            # it as the kernel's gradient divisor (grad / max(1, norm / max_norm), written back
            # to ``self.grad`` by the kernel, as a clip would leave it): no pass of its own.
            norm = scale = None
            if self.max_grad_norm is not None:
                norm = self.grad.norm()
                scale = ((norm + 1e-6) / self.max_grad_norm).clamp_(min=1.0)
            self._count()
            flush = self.flush_denormal and not denormals_flushed() and torch.set_flush_denormal(True)
            try:
                torch._fused_adam_([self.flat], [self.grad], [self.exp_avg], [self.exp_avg_sq], [], [self._step_t],
                                   lr=self.lr, beta1=b1, beta2=b2, weight_decay=0.0, eps=self.eps,
                                   amsgrad=False, maximize=False, grad_scale=scale)
            finally:
                if flush:
                    torch.set_flush_denormal(False)
            return norm
        norm = self.clip_grad_norm()
        self._count()
        steps = self.step_count  # a host read when capturable: this op-by-op path is never captured
        self.exp_avg.lerp_(self.grad, 1.0 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(self.grad, self.grad, value=1.0 - b2)
        bias1 = 1.0 - b1**steps
        bias2 = 1.0 - b2**steps
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)
        return norm

    def _count(self) -> None:
        """One more step: on the host (and copied to ``_step_t``), or on the device alone when capturable."""
        if self.capturable:
            self._step_t.add_(1)
        else:
            self.steps += 1
            self._step_t.fill_(self.steps)

    @property
    def step_count(self) -> int:
        """Steps taken (a host read of the device count when capturable)."""
        return int(self._step_t.item()) if self.capturable else self.steps

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(), "steps": self.step_count,
                "lr": self.lr, "betas": list(self.betas), "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        if state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(f"optimizer state has {state['exp_avg'].numel()} entries, this model {self.exp_avg.numel()}")
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = int(state["steps"])
        self._step_t.fill_(self.steps)  # in place: a captured step reads this tensor
        self.lr, self.betas, self.eps = float(state["lr"]), tuple(state["betas"]), float(state["eps"])


class FlatRMSprop(FlatAdam):
    """RMSprop (Tieleman & Hinton 2012) on FlatAdam's flat layout (parameter and gradient views,
    ``zero_grad``, global-norm clipping), with ``torch.optim.RMSprop``'s math (``centered=False``,
    no momentum, eps outside the square root), which is what SB3's A2C uses:

        square_avg = alpha * square_avg + (1 - alpha) * g^2
        param     -= lr * g / (sqrt(square_avg) + eps)

    ``tests/test_policy_onpolicy.py`` checks it against ``torch.optim.RMSprop`` step by step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 7e-4, alpha: float = 0.99,
                 eps: float = 1e-5, max_grad_norm: float | None = None):
        super().__init__(params, lr=lr, eps=eps, max_grad_norm=max_grad_norm)
        del self.exp_avg  # RMSprop keeps one running average: exp_avg_sq
        self.alpha = alpha

    @torch.no_grad()
    def step(self) -> torch.Tensor | None:
        norm = self.clip_grad_norm()
        self.steps += 1
        self.exp_avg_sq.mul_(self.alpha).addcmul_(self.grad, self.grad, value=1.0 - self.alpha)
        self.flat.addcdiv_(self.grad, self.exp_avg_sq.sqrt().add_(self.eps), value=-self.lr)
        return norm

    def state_dict(self) -> dict:
        return {"square_avg": self.exp_avg_sq.clone(), "steps": self.steps, "lr": self.lr, "alpha": self.alpha,
                "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        if state["square_avg"].shape != self.exp_avg_sq.shape:
            raise ValueError(f"optimizer state has {state['square_avg'].numel()} entries, "
                             f"this model {self.exp_avg_sq.numel()}")
        self.exp_avg_sq.copy_(state["square_avg"])
        self.steps = int(state["steps"])
        self.lr, self.alpha, self.eps = float(state["lr"]), float(state["alpha"]), float(state["eps"])


def scheduled(value: float, schedule: str, progress: float) -> float:
    """``value`` at ``progress`` in [0, 1]: constant, or linear to 0 over the run."""
    return value * ((1.0 - progress) if schedule == "linear" else 1.0)


def hyperparameters(opt) -> list | dict:
    """An optimizer's hyper-parameters as built (torch param groups without their parameters,
    or a flat optimizer's scalars): what loading a saved optimizer state would overwrite."""
    if isinstance(opt, torch.optim.Optimizer):
        return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return {k: v for k, v in opt.state_dict().items() if not torch.is_tensor(v) and k != "steps"}


def set_hyperparameters(opt, hp: list | dict) -> None:
    """Put back what :func:`hyperparameters` returned."""
    if isinstance(opt, torch.optim.Optimizer):
        for group, saved in zip(opt.param_groups, hp):
            group.update(saved)
    else:
        for k, v in hp.items():
            setattr(opt, k, tuple(v) if isinstance(v, list) else v)
