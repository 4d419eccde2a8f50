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
