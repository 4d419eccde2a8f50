"""Stopping a run without losing it: the first SIGINT (Ctrl-C) or SIGTERM (what ``kill``,
schedulers such as SLURM before a preemption, and ``corral bench`` send) pauses the run at its
next update boundary with a checkpoint (``Learner.pause``); a second one aborts at once, as
before. ``corral train``, ``corral resume`` and each ``corral bench`` run use it."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Pause:
    """What ``pause_on_signals`` saw: ``signum`` is the first signal's number, or None."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def exit_code(self) -> int:
        """A shell's code for a process ended by that signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + (self.signum or 0)


@contextmanager
def pause_on_signals(learner, announce: bool = True) -> Iterator[Pause]:
    """Within the block, the first SIGINT / SIGTERM calls ``learner.pause()`` (and, with
    ``announce``, says so on stderr); a second raises ``KeyboardInterrupt``. The previous
    handlers come back on exit. Outside the main thread (where Python takes no signal
    handlers) it changes nothing."""
    seen = Pause()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        if seen.signum is not None:
            raise KeyboardInterrupt
        seen.signum = signum
        learner.pause()
        if announce:
            where = (f"a checkpoint in {learner.run_dir}/checkpoints" if learner.run_dir is not None
                     else "no checkpoint (the run has no directory)")
            print(f"corral: {signal.Signals(signum).name}: stopping after the current update with {where}; "
                  "signal again to abort at once", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield seen
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train_pausable(learner, hooks: list | None = None, announce: bool = True) -> tuple[dict, int | None]:
    """``learner.train(hooks)`` under ``pause_on_signals``: the summary, and the exit code of the
    signal that paused the run (None when it ran to its end)."""
    with pause_on_signals(learner, announce) as seen:
        summary = learner.train(hooks)
    return summary, (seen.exit_code if summary["paused"] else None)
