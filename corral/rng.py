"""One seed spawns independent random streams: envs, action sampling, minibatches,
replay sampling, exploration noise, network init, IQN's quantile fractions,
noisy-net weights, evaluation's own action draws, REDQ's critic subsets, RND's predictor
masks and each worker."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

# A stream's seed depends on its index: new streams go at the end.
# eval_action: evaluation's epsilon-greedy draws (eval.epsilon), a fresh generator per
# evaluation, so evaluating never moves a training stream.
# subset: REDQ's random subset of target critics, drawn anew every gradient step.
# rnd: which samples of a batch train RND's predictor (corral.exploration.rnd).
STREAMS = ("env", "eval_env", "init", "action", "minibatch", "replay", "noise", "tau", "noisy", "eval_action",
           "subset", "rnd")


class RNGStreams:
    def __init__(self, seed: int, device: torch.device | str = "cpu", worker: int = 0):
        self.seed = seed
        self.device = torch.device(device)
        root = np.random.SeedSequence([seed, worker])
        children = root.spawn(len(STREAMS))
        self.seeds = {name: int(c.generate_state(1, dtype=np.uint32)[0]) for name, c in zip(STREAMS, children)}
        self.generators: dict[str, torch.Generator] = {}
        for name in ("action", "minibatch", "replay", "noise", "tau", "noisy", "subset", "rnd"):
            g = torch.Generator(device=self.device)
            g.manual_seed(self.seeds[name])
            self.generators[name] = g

    def __getitem__(self, name: str) -> torch.Generator:
        return self.generators[name]

    def env_seed(self, name: str = "env") -> int:
        return self.seeds[name] % (2**31 - 1024)

    def state_dict(self) -> dict:
        return {"device": self.device.type, **{name: g.get_state() for name, g in self.generators.items()}}

    def load_state_dict(self, state: dict) -> list[str]:
        """Restore the streams; returns the names of those that were reseeded because
        their state came from a generator of another device type (``set_generator_state``)."""
        return [name for name, s in state.items()
                if name in self.generators and not set_generator_state(self.generators[name], s)]


def set_generator_state(gen: torch.Generator, state: torch.Tensor) -> bool:
    """Load a ``torch.Generator`` state saved on any device into ``gen``; True if it fitted.

    A CPU generator (Mersenne Twister, 5056 bytes of state) and a CUDA one (Philox: seed and
    offset) have no state in common, so a checkpoint moved between device types (``corral
    resume --device cuda`` of a CPU run, or back) cannot continue the same draws. Then ``gen``
    is reseeded from a hash of the saved state: the continuation is deterministic for that
    checkpoint (resuming it twice on the new device gives the same run) and is not the
    stream's start again, but it is not the draws the old device would have made; returns False.
    """
    state = state.detach().to("cpu", torch.uint8)
    try:
        gen.set_state(state)
        return True
    except RuntimeError:
        digest = hashlib.sha256(state.contiguous().numpy().tobytes()).digest()
        gen.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return False
