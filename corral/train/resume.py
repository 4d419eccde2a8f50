"""``resume_learner``: a run directory's Learner at its latest checkpoint (``corral resume``,
``corral bench`` for a stopped or interrupted run)."""

from __future__ import annotations

from pathlib import Path

from corral import config as C
from corral.errors import UserError
from corral.train.learner import Learner
from corral.train.setup import resolve_device


def resume_learner(run_dir: str | Path, *, steps: int | None = None, device: str | None = None,
                   sets: list[str] | tuple = (), progress: bool | None = None, quiet: bool = False,
                   finished_ok: bool = False) -> Learner:
    """The Learner of ``run_dir`` at its latest checkpoint, ready to ``train()`` on (``corral
    resume``; ``corral bench`` for an interrupted run). ``steps``: a new total budget;
    ``device``: where to continue; ``sets``: config overrides (``scheme.collectors=2``);
    ``finished_ok``: a checkpoint already at the budget is taken (``train()`` then only runs the
    final evaluation and checkpoint) instead of refused."""
    from corral.train.checkpoint import load_checkpoint
    from corral.train.setup import config_from_dict

    if device is not None:
        resolve_device(device)  # no GPU for --device cuda: one error before anything is read or written
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoints" / "latest.pt"
    if not ckpt.is_file():
        raise UserError(f"{str(run_dir)!r} has no checkpoints/latest.pt to resume from")
    state = load_checkpoint(ckpt)
    cfg = config_from_dict(state["config"])
    if steps is not None:
        cfg.steps = steps
    if device is not None:
        cfg.device = device
    else:
        try:
            resolve_device(cfg.device)
        except UserError:
            raise UserError(f"the run was trained with device {cfg.device!r}, which this machine does not have; "
                            "continue it here with --device cpu (or --device auto)") from None
    if sets:  # e.g. move a run between in-process and Ray workers: --set scheme.collectors=2
        C.apply_set(cfg, C.parse_set(list(sets)))
    if progress is not None:
        cfg.progress = progress
    if state["counters"]["env_steps"] >= cfg.steps and not finished_ok:
        raise UserError(f"the run already has {state['counters']['env_steps']:,} steps; pass --steps with a larger total")
    learner = Learner(cfg, run_dir, quiet=quiet)
    try:
        learner.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError) as e:
        from corral.envs.spaces import layout_of

        layout = layout_of(learner.algo.obs_space) or []
        hint = ("; runs saved before integer parts of Dict / Tuple observations were stored compactly "
                "cannot be resumed (corral.load and corral eval still act with them)") if any(p.nvec for p in layout) else ""
        learner.env.close()
        raise UserError(f"checkpoint {str(ckpt)!r} does not match its config "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:300]}){hint}") from None
    (run_dir / "config.yaml").write_text(C.dump_yaml(cfg))
    return learner
