"""The registry of fast paths: each kernel, the readable code it replaces, and how close it must stay.

A kernel computes what a piece of readable code computes (the *reference*: an algorithm's
``phases``, a loss written with autograd, a net's ``q(obs).argmax``), faster, and runs in its
place at the presets' settings. The reference is the code a reader edits; the kernel lives
here, in ``corral/kernels/``, registered with ``register``:

* ``name``: how tests and docs call it;
* ``reference``: where the readable code is (``module:qualname``);
* ``tolerance``: ``BIT_EXACT`` (0.0: the same bits) or, where the kernel rounds differently
  (another order of the same sums), the largest difference allowed in each result relative to
  that result's largest magnitude (``|kernel - reference| <= tolerance * max |reference|``);
* ``runs``: when it replaces the reference (the settings it covers).

``tests/test_kernels.py`` runs every registered kernel against its reference on fixed inputs
at the presets' shapes, and fails if a registered kernel has no such case. So an edit to a
reference that its kernel does not follow fails a test. A subclass that overrides the
reference is a different matter: the kernel cannot know the new math, so it steps aside
(``Replaces``): the subclass trains with its own code, the readable path."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

BIT_EXACT = 0.0


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    fast: str  # ``module:qualname`` of the kernel
    reference: str  # ``module:qualname`` of the readable code it equals
    tolerance: float  # BIT_EXACT, or the largest difference relative to the result's largest magnitude
    runs: str  # when it replaces the reference


KERNELS: dict[str, Kernel] = {}


def register(name: str, *, reference: str, tolerance: float, runs: str) -> Callable[[Any], Any]:
    """Records the decorated function or class as the kernel ``name`` (a name is registered once)."""

    def record(obj):
        if name in KERNELS:
            raise ValueError(f"kernel {name!r} is registered twice ({KERNELS[name].fast}); pick another name")
        KERNELS[name] = Kernel(name, f"{obj.__module__}:{obj.__qualname__}", reference, tolerance, runs)
        obj.kernel_name = name
        return obj

    return record


class Replaces:
    """An algorithm's (or a network's) declaration that the registered kernel ``fn`` computes
    its readable methods, given as the functions the kernel was checked against
    (``direct = Replaces(huber_direct_step, phases=phases)`` in the class body). ``in_force(cls)``
    holds while ``cls`` still uses those functions: a subclass that overrides one of them (a
    newcomer's variant with its own loss) gets the readable path, its own code, with no flag to set."""

    def __init__(self, fn: Callable, **methods: Callable):
        name = getattr(fn, "kernel_name", None)
        if name not in KERNELS:
            raise ValueError(f"{fn!r} is not a registered kernel: decorate it with corral.kernels.registry.register")
        if not methods:
            raise ValueError(f"Replaces({name!r}) names no method the kernel follows")
        self.fn, self.kernel, self.methods = fn, name, methods

    def in_force(self, cls: type) -> bool:
        return all(getattr(cls, name, None) is method for name, method in self.methods.items())

    def __repr__(self) -> str:
        return f"Replaces({self.kernel!r}, {', '.join(self.methods)})"
