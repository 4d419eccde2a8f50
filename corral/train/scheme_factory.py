"""The distributed scheme a run asks for (``scheme.collectors`` or ``scheme.grad_workers`` > 1).

The schemes sit above training (they build their workers with ``corral.train.setup`` and
checkpoints), so the Learner does not import them: ``corral.schemes`` registers its factory
here when it is imported, and ``import corral`` imports it, which every ``import corral.X``
does first. The Learner calls :func:`make_scheme`; a process that somehow bypassed the package
gets one message naming the fix."""

from __future__ import annotations

from typing import Any, Callable

from corral.errors import UserError

_FACTORY: list[Callable[[Any], Any]] = []


def register_scheme_factory(factory: Callable[[Any], Any]) -> None:
    """Set the function that builds a Learner's distributed scheme (``corral.schemes.make_scheme``)."""
    _FACTORY[:] = [factory]


def make_scheme(learner: Any) -> Any:
    """The scheme for ``learner``'s config (local collectors, or Ray's), from the registered factory."""
    if not _FACTORY:
        raise UserError("scheme.collectors/grad_workers > 1 need the distributed schemes, which are not "
                        "registered in this process: import corral.schemes (import corral does)")
    return _FACTORY[0](learner)
