import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield
