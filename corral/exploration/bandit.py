"""Agent57's meta-controller (Badia et al. 2020b, appendix): a sliding-window UCB bandit
with epsilon-greedy over the ``N`` mixtures, one per collector.

Arms are chosen at episode starts and rewarded with the episode's extrinsic return. The
first ``N`` choices go through the arms once each; after that, with probability
``epsilon`` an arm is drawn uniformly, else

    argmax_a  mu(a) + beta * sqrt(1 / n(a))

where ``n(a)`` and ``mu(a)`` are the count and mean return of arm ``a`` among the last
``window`` finished episodes (an arm absent from the window scores +inf: it is tried). The
paper's values: window 160, beta 1, epsilon 0.5. Everything is tensors; the state (window,
counters, the generator) is in ``state_dict``.
"""

from __future__ import annotations

from typing import Any

import torch


class SlidingWindowUCB:
    def __init__(self, arms: int, window: int = 160, beta: float = 1.0, epsilon: float = 0.5, seed: int = 0,
                 device="cpu"):
        self.arms, self.window = int(arms), int(window)
        self.beta, self.epsilon = float(beta), float(epsilon)
        self.device = torch.device(device)
        self.arm_hist = torch.zeros(self.window, dtype=torch.long, device=self.device)
        self.reward_hist = torch.zeros(self.window, dtype=torch.float64, device=self.device)
        self.filled = 0  # entries of the window in use
        self.ptr = 0
        self.chosen = 0  # arms chosen so far (the first ``arms`` go round once)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))

    def window_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(counts [arms], mean returns [arms])`` over the window (mean 0 where count 0)."""
        arms, rewards = self.arm_hist[:self.filled], self.reward_hist[:self.filled]
        counts = torch.bincount(arms, minlength=self.arms).double()
        sums = torch.zeros(self.arms, dtype=torch.float64, device=self.device).index_add_(0, arms, rewards)
        return counts, sums / counts.clamp(min=1.0)

    def scores(self) -> torch.Tensor:
        counts, mean = self.window_stats()
        bonus = torch.where(counts > 0, self.beta * (1.0 / counts.clamp(min=1.0)).sqrt(), torch.inf)
        return mean + bonus

    def select(self, count: int) -> torch.Tensor:
        """``[count]`` arms for ``count`` episodes starting now (all see the same window)."""
        order = self.chosen + torch.arange(count, device=self.device)
        greedy = self.scores().argmax()
        u = torch.rand(count, generator=self.generator, device=self.device)
        rand_arm = torch.randint(self.arms, (count,), generator=self.generator, device=self.device)
        arm = torch.where(u < self.epsilon, rand_arm, greedy)
        self.chosen += count
        return torch.where(order < self.arms, order, arm)

    def update(self, arms: torch.Tensor, returns: torch.Tensor) -> None:
        """The episodes that just ended: their arms and extrinsic returns, oldest first."""
        m = int(arms.numel())
        if m == 0:
            return
        slots = (self.ptr + torch.arange(m, device=self.device)) % self.window
        self.arm_hist[slots] = arms.to(self.device, torch.long).reshape(-1)
        self.reward_hist[slots] = returns.to(self.device, torch.float64).reshape(-1)
        self.ptr = (self.ptr + m) % self.window
        self.filled = min(self.window, self.filled + m)

    def state_dict(self) -> dict[str, Any]:
        return {"arm_hist": self.arm_hist.clone(), "reward_hist": self.reward_hist.clone(), "filled": self.filled,
                "ptr": self.ptr, "chosen": self.chosen, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arm_hist.copy_(state["arm_hist"]); self.reward_hist.copy_(state["reward_hist"])  # noqa: E702
        self.filled, self.ptr, self.chosen = int(state["filled"]), int(state["ptr"]), int(state["chosen"])
        self.generator.set_state(state["generator"])
