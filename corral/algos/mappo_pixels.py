"""MAPPO / IPPO on pixel envs (:mod:`corral.envs.ma_pixels`): what a run needs checked before
it allocates anything, its memory estimated and refused with the numbers where it would not fit.

The run's own allocations (:func:`corral.actors.pixel_agents.pixel_run_bytes`): the rollout's
packed uint8 steps (``n_steps x num_envs`` rows of the env's packed size), the per-agent pointer
rows and scalars, one minibatch's float frames and CNN activations (twice for MAPPO, whose
value has its own CNN), the envs' frame stacks. They are compared with the memory the device
has available when the algorithm is built (the envs and this process are already there).
"""

from __future__ import annotations

from typing import Any

import torch

from corral.actors.pixel_agents import pixel_run_bytes
from corral.envs.agent_layout import AgentLayout
from corral.errors import UserError
from corral.storage.replay import available_memory


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def check_pixel_run(name: str, cfg: Any, layout: AgentLayout, num_envs: int, role: str,
                    device: torch.device) -> dict[str, int]:
    """Refuse what the pixel actor does not build, and a learner whose run would not fit in the
    device's available memory (the message names what it needs, what there is, and the options
    that lower it). Returns the estimate by part (bytes)."""
    if not cfg.share_params:
        raise UserError(f"{name}.share_params=false is not built for pixel envs: one Nature CNN is shared by all "
                        "agents (a one-hot agent id beside its features); leave it true")
    if cfg.centralized_value and not layout.has_state:
        raise UserError(f"{name}: the env has no image state() for a centralized value; run ippo "
                        f"(or {name}.centralized_value=false)")
    parts = pixel_run_bytes(layout, num_envs, cfg.n_steps, cfg.batch_size, cfg.centralized_value, layout.discrete)
    if role != "learner":
        return parts
    need, have = sum(parts.values()), available_memory(device)
    if have is not None and need > have:
        rows = cfg.n_steps * num_envs * layout.n_agents
        batch = rows if cfg.batch_size <= 0 else min(cfg.batch_size, rows)
        raise UserError(
            f"{name} on this pixel env needs about {_gb(need)} of {device.type} memory and {_gb(have)} is available: "
            f"frames {_gb(parts['frames'])} ({cfg.n_steps} steps x {num_envs} envs x {layout.size / 1e6:.2f} MB a "
            f"packed step), minibatch {_gb(parts['minibatch'])} ({batch} agent steps through the CNN"
            f"{'s' if cfg.centralized_value else ''}), rollout {_gb(parts['rollout'])}, envs {_gb(parts['envs'])}. "
            f"Lower {name}.batch_size (the minibatch), {name}.n_steps or env.num_envs (the frames), or "
            f"env.pixels.size / env.pixels.stack (every part)")
    return parts
