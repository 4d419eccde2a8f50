"""corral: composable, fast deep reinforcement learning on PyTorch."""

__version__ = "0.1.0"

from corral.agent import Agent, evaluate, load, train  # noqa: E402
from corral.algos import register_algo  # noqa: E402
from corral.envs import register  # noqa: E402

__all__ = ["Agent", "evaluate", "load", "register", "register_algo", "train", "__version__"]
