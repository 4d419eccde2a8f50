"""REDQ (Chen et al. 2021, "Randomized Ensembled Double Q-Learning: learning fast without a
model") and DroQ (Hiraoka et al. 2022, "Dropout Q-Functions for doubly efficient RL").

REDQ is SAC with three changes: an ensemble of ``N`` critics (one batched module), a target
that takes the min over a random subset of ``M`` of them, drawn anew every gradient step
from the run's ``subset`` stream, and a high update-to-data ratio ``G`` (``gradient_steps``),
the actor updated once per ``G`` critic steps (``policy_delay``) on the mean over all ``N``.

DroQ replaces the large ensemble with ``N = M = 2`` critics regularised by dropout and layer
norm (``dropout``, ``layer_norm``), at the same high ratio. The dropout masks are drawn from
the noise stream with the step's other draws, so steps are reproducible and resume exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.actors.normed import DropoutCritics
from corral.algos.sac import SAC, SACConfig
from corral.config import option
from corral.errors import UserError


@dataclass
class REDQConfig(SACConfig):
    n_critics: int = option(10, "ensemble size N", ge=1)
    subset: int = option(2, "critics in the target's min (M), a fresh random subset every gradient step", ge=1)
    gradient_steps: int = option(20, "update-to-data ratio G: critic steps per update", ge=1, also=(-1,))
    policy_delay: int = option(20, "actor (and alpha) steps every this many critic steps (REDQ: G)", ge=1)
    dropout: float = option(0.0, "critic dropout rate after each hidden linear layer (DroQ: 0.01)", ge=0, lt=1)
    layer_norm: bool = option(False, "layer norm after each hidden critic layer's dropout (DroQ)")


DROQ_OVERRIDES = {"n_critics": 2, "subset": 2, "dropout": 0.01, "layer_norm": True}


class REDQ(SAC):
    name = "redq"
    Config = REDQConfig

    def __init__(self, cfg: REDQConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if cfg.subset > cfg.n_critics:
            raise UserError(f"{self.name}: subset={cfg.subset} is more than n_critics={cfg.n_critics}; "
                            f"set subset <= n_critics (REDQ: N=10, M=2)")
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)

    @property
    def _normed(self) -> bool:
        return self.cfg.dropout > 0 or self.cfg.layer_norm

    def make_critics(self, actor):
        if not self._normed:
            return super().make_critics(actor)
        cfg = self.cfg
        own = self.obs_space if actor.enc.trainable else None
        return DropoutCritics(actor.enc.dim, actor.box.dim, cfg.n_critics, tuple(cfg.hidden), cfg.activation,
                              cfg.layer_norm, own)

    def draw_noise(self, batch_size):
        noise = super().draw_noise(batch_size)
        cfg = self.cfg
        if cfg.subset < cfg.n_critics:
            # one subset per step, as a row per transition so gradient workers' shards carry it
            subset = torch.randperm(cfg.n_critics, generator=self.rng["subset"], device=self.device)[:cfg.subset]
            noise["subset"] = subset.expand(batch_size, cfg.subset)
        if cfg.dropout > 0:
            keep = 1.0 - cfg.dropout
            for use in ("next", "cur") + (("new",) if "new" in noise else ()):
                for i, h in enumerate(cfg.hidden):
                    shape = (batch_size, cfg.n_critics, h)
                    draw = torch.rand(shape, generator=self.rng["noise"], device=self.device)
                    noise[f"drop_{use}{i}"] = (draw < keep).float().div_(keep)
        return noise

    def _masks(self, noise, use):
        return [noise[f"drop_{use}{i}"] for i in range(len(self.cfg.hidden))] if self.cfg.dropout > 0 else None

    def _q(self, net, view, action, noise, use):
        return net(view, action, self._masks(noise, use)) if self._normed else net(view, action)

    def target_q(self, next_obs_view, next_action, noise):
        subset = noise["subset"][0] if "subset" in noise else None
        if self._normed:  # DroQ: M = N, every critic in the min
            q = self._q(self.critics_target, next_obs_view, next_action, noise, "next")
            return (q if subset is None else q[subset]).min(0).values
        # only the subset's critics are evaluated: M of N forwards
        return self.critics_target(next_obs_view, next_action, subset).min(0).values

    def current_q(self, obs_view, action, noise):
        return self._q(self.critics, obs_view, action, noise, "cur")

    def actor_q(self, obs_view, new_action, noise):
        """The actor maximises the mean over all N critics (REDQ's and DroQ's policy loss)."""
        return self._q(self.critics, obs_view, new_action, noise, "new").mean(0)
