"""A user's module for tests: an Algorithm subclass with its own Storage subclass, registered
under a name (what `corral train --import` / `imports=` make available everywhere)."""

import corral
from corral.algos.ppo import PPO
from corral.storage.rollout import RolloutStorage


class CountingStorage(RolloutStorage):
    """A rollout storage that counts what it stored (a user's Storage subclass)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.added = 0

    def add(self, **values):
        self.added += 1
        super().add(**values)


class CountingPPO(PPO):
    """PPO whose rollout storage is the user's."""

    name = "counting_ppo"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.storage is not None:
            s = self.storage
            self.storage = CountingStorage(s.num_steps, s.num_envs, tuple(s.data.obs.shape[2:]),
                                           tuple(s.data.actions.shape[2:]), s.data.actions.dtype,
                                           s.data.obs.device, s.data.obs.dtype)


corral.register_algo("counting_ppo", CountingPPO, help="PPO with a counting rollout storage (tests)")
