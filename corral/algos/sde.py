"""gSDE's options and its acting state, shared by the algorithms that take it (SAC and TQC on
the replay loop, PPO and A2C on the on-policy loop). The distribution is
``corral.nets.sde.StateDependentNoise``; the actors that use it are ``corral.actors.sde``.

While collecting, each env column has its own exploration matrix (a unit-normal draw ``z``,
``theta = sigma * z``), redrawn as Stable-Baselines3 redraws it: at the start of every
rollout (on-policy: ``n_steps`` vector steps; replay algorithms: ``train_freq`` vector steps,
the span SB3's ``collect_rollouts`` covers) and, with ``sde_sample_freq = n > 0``, every
``n`` vector steps within it. The draws come from the ``action`` stream and are checkpointed
with the step counter, so a resumed run acts with the matrices a run that never stopped has."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.config import option
from corral.errors import UserError


@dataclass
class SDEConfig:
    use_sde: bool = option(
        False, "generalized State-Dependent Exploration (gSDE, Raffin et al. 2021): exploration noise "
               "phi(s) @ theta, theta a matrix held between redraws (Box actions; docs/algos)")
    sde_sample_freq: int = option(
        -1, "gSDE: redraw the exploration matrices every this many vector steps; -1 (or 0): only at the start "
            "of each rollout (SB3's meaning)", ge=-1)
    full_std: bool = option(True, "gSDE: one learned std per (feature, action) entry; false: one per feature")
    use_expln: bool = option(
        False, "gSDE: sigma = exp(log_std) below 0 and log1p(log_std) + 1 above (SB3's expln), instead of exp")


def sde_options_unused(algo: str, options) -> None:
    """Refuse gSDE options set while ``use_sde`` is off (they would do nothing, silently):
    ``options`` are ``(name, value, default)``."""
    changed = [f"{algo}.{name}={value!r}" for name, value, default in options if value != default]
    if changed:
        raise UserError(f"{', '.join(changed)}: gSDE's option{'s act' if len(changed) > 1 else ' acts'} only with "
                        f"{algo}.use_sde=true; set it, or leave {'them' if len(changed) > 1 else 'it'} at the default")


class SDEExploration:
    """Each env column's exploration matrix draw and the cadence of its redraws.

    ``rollout``: the vector steps between two rollout starts (a redraw at each);
    ``sample_freq``: SB3's ``sde_sample_freq``."""

    def __init__(self, latent_dim: int, act_dim: int, num_envs: int, rollout: int, sample_freq: int,
                 device: torch.device):
        self.rollout, self.sample_freq = int(rollout), int(sample_freq)
        self.z = torch.zeros(num_envs, latent_dim, act_dim, device=device)
        self.step = 0  # vector steps acted so far

    def redraw_due(self) -> bool:
        """Whether the step about to be acted starts with new matrices."""
        k = self.step % self.rollout  # the step's index within its rollout
        return k % self.sample_freq == 0 if self.sample_freq > 0 else k == 0

    def next(self, noise, n: int, generator: torch.Generator) -> torch.Tensor:
        """The ``[n, L, A]`` draws for this vector step (``noise``: the actor's
        ``StateDependentNoise``), redrawn when due; advances the step counter."""
        if self.redraw_due() or self.z.shape[0] != n:
            self.z = noise.draw(n, generator)
        self.step += 1
        return self.z

    def state_dict(self) -> dict:
        return {"z": self.z.clone(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.z = state["z"].to(self.z.device).clone()
        self.step = int(state["step"])
