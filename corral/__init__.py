"""corral: composable, fast deep reinforcement learning on PyTorch."""

__version__ = "0.1.0"

from corral.agent import Agent, evaluate, load, train  # noqa: E402
from corral.algos import register_algo  # noqa: E402
from corral.compose import AlgoFactory, Scheme, VecEnvFactory  # noqa: E402
from corral.envs import register  # noqa: E402
from corral.population.ensemble import Ensemble, fuse  # noqa: E402
from corral.schemes import make_scheme as _make_scheme  # noqa: E402, F401 - registers the schemes with the Learner
from corral.storage import register_storage  # noqa: E402
from corral.train.learner import Learner  # noqa: E402


def tune(*args, **kwargs):
    """Hyper-parameter search on Ray Tune (``corral.population.tune.tune``; needs corral[tune])."""
    from corral.population.tune import tune as run

    return run(*args, **kwargs)


def pbt(*args, **kwargs):
    """Population-based training on Ray Tune (``corral.population.pbt.pbt``; needs corral[tune])."""
    from corral.population.pbt import pbt as run

    return run(*args, **kwargs)


__all__ = ["Agent", "AlgoFactory", "Ensemble", "Learner", "Scheme", "VecEnvFactory", "evaluate", "fuse", "load",
           "pbt", "register", "register_algo", "register_storage", "train", "tune", "__version__"]
