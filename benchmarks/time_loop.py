"""Run the corral CLI with the training loop's calls timed: wall seconds (device-synchronised
around each call) spent in explore, env.step, observe, update, and the replay's sample /
update_priorities, with calls and ms per call, printed every TIMING_PERIOD seconds (30).

    python benchmarks/time_loop.py train rainbow Pong --device cuda --steps 50000
    TIMING_PERIOD=5 python benchmarks/time_loop.py train qrdqn CartPole-v1
"""

from __future__ import annotations

import collections
import importlib
import os
import sys
import time

import torch

L = importlib.import_module("corral.train.learner")  # corral.train is also a function

acc = collections.defaultdict(float)
cnt = collections.Counter()
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
last = [time.perf_counter()]
PERIOD = float(os.environ.get("TIMING_PERIOD", 30))


def timed(fn, name):
    def f(*a, **k):
        sync()
        t = time.perf_counter()
        r = fn(*a, **k)
        sync()
        acc[name] += time.perf_counter() - t
        cnt[name] += 1
        now = time.perf_counter()
        if now - last[0] > PERIOD:
            last[0] = now
            print("TIMING " + "  ".join(f"{k}={acc[k]:.1f}s/{cnt[k]}({1e3 * acc[k] / max(cnt[k], 1):.2f}ms)"
                                        for k in sorted(acc)), flush=True)
        return r
    return f


_stream = L.Learner.stream


def stream(self):
    a, e = self.algo, self.env
    for name in ("explore", "observe", "update"):
        setattr(a, name, timed(getattr(a, name), name))
    e.step = timed(e.step, "env_step")
    r = getattr(a, "replay", None)
    if r is not None:
        for name in ("sample", "update_priorities"):
            if hasattr(r, name):
                setattr(r, name, timed(getattr(r, name), name))
    return _stream(self)


L.Learner.stream = stream
from corral.cli import main  # noqa: E402

sys.exit(main())
