"""corral: composable, fast deep reinforcement learning on PyTorch."""

__version__ = "0.1.0"

from corral.agent import Agent, evaluate, load, train  # noqa: E402
from corral.algos import register_algo  # noqa: E402
from corral.compose import AlgoFactory, Scheme, VecEnvFactory  # noqa: E402
from corral.envs import register  # noqa: E402
from corral.storage import register_storage  # noqa: E402
from corral.train.learner import Learner  # noqa: E402

__all__ = ["Agent", "AlgoFactory", "Learner", "Scheme", "VecEnvFactory", "evaluate", "load", "register",
           "register_algo", "register_storage", "train", "__version__"]
