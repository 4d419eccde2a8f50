"""Training: the Learner loop (``learner``), its hooks (``hooks``), run setup (``setup``),
checkpoints and evaluation."""

from corral.train.checkpoint import load_checkpoint, save_checkpoint
from corral.train.learner import Learner
from corral.train.setup import build_config, make_env, new_run_dir, resolve_device

__all__ = ["Learner", "build_config", "load_checkpoint", "make_env", "new_run_dir", "resolve_device",
           "save_checkpoint"]
