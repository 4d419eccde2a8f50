"""The live table of a suite's runs: state, steps, steps/s, latest evaluation, ETA. Read from
the runs' ``status.json`` files, so it shows runs on other Ray nodes too. On a terminal it is
a rich live table; otherwise one line per run whenever its state changes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from corral.bench.runner import read_json


def _eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Table:
    def __init__(self, out: Path, runs: list, live: bool = True, every: float = 1.0):
        self.out, self.runs = out, runs
        self.every, self.last = every, 0.0
        self.states: dict[str, str] = {}
        self.live = None
        if live and sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(self.render({}), console=Console(stderr=True), refresh_per_second=2)
            self.live.start()

    def row(self, run, running: dict) -> tuple[str, ...]:
        d = self.out / "runs" / run.name
        status = read_json(d / "status.json", {})
        bench = read_json(d / "bench.json", {})
        if (d / "result.json").is_file():
            state = "done"
        elif bench.get("refused"):
            state = "refused"
        elif running.get(run.name) or (status.get("state") == "running" and time.time() - status.get("time", 0) < 30):
            state = "running"
        elif status.get("state") == "stopped":
            state = "stopped"
        elif bench.get("failures"):
            state = f"failed x{bench['failures']}"
        else:
            state = "queued"
        steps = status.get("steps", 0)
        sps = status.get("steps_per_s") or 0.0
        ev = status.get("eval")
        eta = (run.steps - steps) / sps if state == "running" and sps > 0 else None
        return (run.name, state, f"{steps:,}/{run.steps:,}", f"{sps:,.0f}" if state == "running" else "",
                "-" if ev is None else f"{ev:.1f}", _eta(eta) if state == "running" else "")

    def render(self, running: dict):
        from rich.table import Table as RichTable

        t = RichTable(title=f"corral bench: {self.out}", expand=False)
        for col in ("run", "state", "steps", "steps/s", "latest eval", "ETA"):
            t.add_column(col)
        counts: dict[str, int] = {}
        for run in self.runs:
            r = self.row(run, running)
            counts[r[1].split()[0]] = counts.get(r[1].split()[0], 0) + 1
            t.add_row(*r)
        t.caption = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        return t

    def update(self, running: dict) -> None:
        now = time.time()
        if now - self.last < self.every:
            return
        self.last = now
        if self.live is not None:
            self.live.update(self.render(running))
            return
        for run in self.runs:
            r = self.row(run, running)
            state = r[1]
            if self.states.get(run.name) != state:
                self.states[run.name] = state
                extra = f", eval {r[4]}" if state == "done" else ""
                print(f"corral bench: {run.name} {state} ({r[2]} steps{extra})", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.last = 0.0
        if self.live is not None:
            self.live.update(self.render({}))
            self.live.stop()
        else:
            self.update({})
