"""Storage: rollouts for on-policy algorithms, replay for off-policy ones."""

from corral.storage.rollout import RolloutBatch, RolloutStorage

__all__ = ["RolloutBatch", "RolloutStorage"]
