"""What the benchmark scripts share on the SB3 side: a callback that stops at a last-20
training return, timed from the first env step."""

from __future__ import annotations

import time


def stop_at_return(target: float):
    """A fresh SB3 callback: ``reached_at`` becomes ``(seconds, env steps)`` when the mean
    return of the last 20 finished episodes first reaches ``target`` (training then stops)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAt(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = None
            self.reached_at = None

        def _on_training_start(self):
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= 20 and sum(ep["r"] for ep in list(buf)[-20:]) / 20 >= target:
                self.reached_at = (time.perf_counter() - self.t0, self.num_timesteps)
                return False
            return True

    return StopAt()
