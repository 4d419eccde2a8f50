"""Schemes: where collection and gradient work run. In-process is the Learner's own
stream; distributed schemes (Ray) plug in through ``make_scheme``."""

from __future__ import annotations

from corral.errors import UserError


def make_scheme(learner):
    if learner.cfg.scheme.backend == "local":
        from corral.schemes.fragments import FragmentScheme

        return FragmentScheme(learner)
    try:
        from corral.schemes.ray_scheme import RayScheme
    except ImportError as e:
        raise UserError(f"scheme.collectors/grad_workers > 1 need Ray: pip install 'corral[ray]' ({e})") from None
    return RayScheme(learner)
