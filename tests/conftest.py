import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def ray_local():
    """A small local Ray (2 CPUs), started once and shared by the tests that need one."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    return ray


def ray_scheme_killing_a_collector(learner, ray, after_fragments: int = 10, worker: int = 1):
    """A Ray scheme for ``learner`` that kills collector ``worker`` (no Ray restart: corral must
    restart it) once ``after_fragments`` fragments were consumed; returns (scheme, killed), where
    ``killed`` holds the fragment meta at the kill."""
    from corral.schemes.ray_scheme import RayScheme

    scheme = RayScheme(learner)
    killed: list = []

    def kill_once(meta, data):
        if scheme.fragments == after_fragments and not killed:
            ray.kill(scheme.pool.actors[worker], no_restart=True)
            killed.append(meta)

    scheme.fragment_callback = kill_once
    learner.make_stream = scheme.stream
    return scheme, killed
