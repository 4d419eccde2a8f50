"""Training: the Learner loop, run directories, metrics, checkpoints, evaluation."""

from corral.train.checkpoint import load_checkpoint, save_checkpoint
from corral.train.learner import Learner, build_config, new_run_dir

__all__ = ["Learner", "build_config", "load_checkpoint", "new_run_dir", "save_checkpoint"]
