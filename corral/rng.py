"""One seed spawns independent random streams: envs, action sampling, minibatches,
replay sampling, exploration noise, network init and each worker."""

from __future__ import annotations

import numpy as np
import torch

STREAMS = ("env", "eval_env", "init", "action", "minibatch", "replay", "noise")


class RNGStreams:
    def __init__(self, seed: int, device: torch.device | str = "cpu", worker: int = 0):
        self.seed = seed
        self.device = torch.device(device)
        root = np.random.SeedSequence([seed, worker])
        children = root.spawn(len(STREAMS))
        self.seeds = {name: int(c.generate_state(1, dtype=np.uint32)[0]) for name, c in zip(STREAMS, children)}
        self.generators: dict[str, torch.Generator] = {}
        for name in ("action", "minibatch", "replay", "noise"):
            g = torch.Generator(device=self.device)
            g.manual_seed(self.seeds[name])
            self.generators[name] = g

    def __getitem__(self, name: str) -> torch.Generator:
        return self.generators[name]

    def env_seed(self, name: str = "env") -> int:
        return self.seeds[name] % (2**31 - 1024)

    def state_dict(self) -> dict:
        return {name: g.get_state() for name, g in self.generators.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, s in state.items():
            if name in self.generators:
                self.generators[name].set_state(s)
