"""Storage: rollouts for on-policy algorithms, replay for off-policy ones.

A user's storage class enters a run by name: ``corral.register_storage(name, cls)`` (or
``'module:Class'``), then ``--set ppo.storage=name``; the PPO family builds it in place of
:class:`RolloutStorage`, with the same constructor arguments. A replay class (a subclass of
:class:`~corral.storage.replay.ReplayBuffer`, such as ``her``) is named by a replay
algorithm's ``replay`` option instead (``--set replay=her``)."""

from __future__ import annotations

from corral.errors import UserError
from corral.storage.her import HerReplayBuffer
from corral.storage.rollout import RolloutBatch, RolloutStorage

# "her": hindsight relabelling over the replay (replay=her on a replay algorithm, corral/storage/her.py)
STORAGES: dict[str, type] = {"rollout": RolloutStorage, "her": HerReplayBuffer}


def register_storage(name: str, cls: type) -> None:
    """Make ``cls`` (a subclass of a built-in storage) selectable by ``name`` in a config."""
    if not isinstance(cls, type):
        raise UserError(f"register_storage({name!r}, ...): give a class, got {type(cls).__name__}")
    STORAGES[name] = cls


def storage_class(spec: str | None, base: type, option: str) -> type:
    """The class ``spec`` names (a registered name, or ``'module:Class'``; None: ``base``),
    checked to be ``base`` or a subclass of it (``option`` names the config key in errors)."""
    if spec is None:
        return base
    if spec in STORAGES:
        cls = STORAGES[spec]
    elif ":" in spec:
        from corral.envs.make import _load_attr

        cls = _load_attr(spec, option)
    else:
        raise UserError(f"{option}={spec!r} is neither a registered storage ({', '.join(sorted(STORAGES))}) nor "
                        "'module:Class'; register it with corral.register_storage(name, cls)")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UserError(f"{option}={spec!r} must be a subclass of {base.__module__}.{base.__name__}, got {cls!r}")
    return cls


__all__ = ["STORAGES", "HerReplayBuffer", "RolloutBatch", "RolloutStorage", "register_storage", "storage_class"]
