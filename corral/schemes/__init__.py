"""Schemes: where collection and gradient work run. In-process is the Learner's own
stream; distributed schemes (local collectors, Ray) plug in through ``make_scheme``, which
this package registers with the training layer (``corral.train.scheme_factory``) when it is
imported; ``corral/__init__.py`` imports it, so a Learner always finds it."""

from __future__ import annotations

from corral.errors import UserError
from corral.train.scheme_factory import register_scheme_factory


def make_scheme(learner):
    if learner.cfg.scheme.backend == "local":
        from corral.schemes.fragments import FragmentScheme

        return FragmentScheme(learner)
    try:
        from corral.schemes.ray_scheme import RayScheme
    except ImportError as e:
        raise UserError(f"scheme.collectors/grad_workers > 1 need Ray: pip install 'corral[ray]' ({e})") from None
    return RayScheme(learner)


register_scheme_factory(make_scheme)
