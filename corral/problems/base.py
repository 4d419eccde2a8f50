"""What every problem in ``corral.problems`` provides, and the record every solver returns.

A :class:`Problem` is one instance over ``n`` binary variables. The search works on *internal*
0/1 vectors ``x [B, n]`` (bool), many at once:

* ``score(x)``: the objective of feasible rows, float64 ``[B]``, always to be maximized
  (a minimization problem scores the negated value, or an equivalent, see ``export``);
* ``feasible(x)``: bool ``[B]``; ``repair(x, keep, gen)``: feasible rows, keeping the
  variables in ``keep`` where it can (the ones a perturbation just set);
* ``improve(x, gen)``: a batched local search that returns feasible rows no worse;
* ``random(B, gen)``: feasible starting rows.

The user sees a *solution* (int8 0/1 ``[n]``) and its *value*: ``export(x)`` turns an internal
row into the solution, and ``check(solution)`` recomputes the value from the solution and the
instance alone, raising :class:`InfeasibleSolution` if it breaks a constraint. Minimum vertex
cover, for example, searches independent sets and exports their complements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from corral.errors import UserError


class InfeasibleSolution(UserError):
    """A solution that breaks a constraint of its problem (the message says which)."""


class Problem:
    """One instance; subclasses fill in the methods below (see the module docstring)."""

    kind: str = "problem"  # the name `corral solve` knows it by
    sense: str = "max"  # of the user's value
    n: int
    name: str = "instance"
    optimum: float | None = None  # a known optimal value (e.g. a planted solution), else None
    device: torch.device = torch.device("cpu")

    # -- internal, batched
    def score(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def feasible(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones(x.shape[0], dtype=torch.bool, device=x.device)

    def repair(self, x: torch.Tensor, keep: torch.Tensor | None = None,
               gen: torch.Generator | None = None) -> torch.Tensor:
        return x

    def improve(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        return x

    def random(self, batch: int, gen: torch.Generator | None = None) -> torch.Tensor:
        x = torch.rand(batch, self.n, generator=gen, device=self.device) < 0.5
        return self.improve(self.repair(x, gen=gen), gen)

    # -- the user's side
    def export(self, x: torch.Tensor) -> torch.Tensor:
        """The user's solution (int8 0/1 ``[n]`` on CPU) for one internal row."""
        return x.to("cpu", torch.int8)

    def value_of_score(self, score: float) -> float:
        """The user's value of an internal score (identity for a maximization)."""
        return float(score)

    def check(self, solution) -> float:
        """The value of ``solution`` recomputed from it and the instance alone; raises
        :class:`InfeasibleSolution` (naming the broken constraint) if it is not feasible."""
        raise NotImplementedError

    def _as_solution(self, solution) -> torch.Tensor:
        s = torch.as_tensor(solution).reshape(-1)
        if s.numel() != self.n:
            raise InfeasibleSolution(f"{self.kind} {self.name}: the solution has {s.numel()} entries, "
                                     f"the instance {self.n} variables")
        if not bool(((s == 0) | (s == 1)).all()):
            raise InfeasibleSolution(f"{self.kind} {self.name}: a solution holds 0 or 1 per variable")
        return s.to(torch.int64)

    def describe(self) -> dict[str, Any]:
        return {"nodes": self.n}


@dataclass
class Result:
    """What a solver returns, for every problem and method.

    ``value``: the best value found (the user's objective: a cut, a set size, a cover size);
    ``solution``: int8 0/1 ``[n]`` achieving it; ``seconds``: the whole run; ``time_to_best``:
    seconds until ``value`` was first reached; ``history``: ``[(seconds, best value so far)]``
    each time it improved; ``optimum``: a known optimal value, when the instance has one;
    ``info``: the method's own figures (flips, updates, rounds, ...).
    """

    problem: str
    instance: str
    method: str
    sense: str
    value: float
    solution: torch.Tensor
    seconds: float
    time_to_best: float | None
    history: list[tuple[float, float]] = field(default_factory=list)
    optimum: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def check(self, problem: Problem) -> float:
        """Recompute the value from ``solution`` and the instance; raises if the solution is
        infeasible or its value is not the one recorded."""
        v = problem.check(self.solution)
        if not math.isclose(v, self.value, rel_tol=1e-9, abs_tol=1e-6):
            raise InfeasibleSolution(f"{self.problem} {self.instance}: the solution's value is {v}, "
                                     f"the result records {self.value}")
        return v

    @property
    def ratio(self) -> float | None:
        """value / optimum for a maximization, optimum / value for a minimization (<= 1)."""
        if self.optimum is None or not self.value:
            return None
        return self.value / self.optimum if self.sense == "max" else self.optimum / self.value

    def record(self) -> dict[str, Any]:
        """A JSON-ready summary (no solution)."""
        value = int(self.value) if float(self.value).is_integer() else self.value
        return {"problem": self.problem, "instance": self.instance, "method": self.method, "value": value,
                "optimum": self.optimum, "seconds": self.seconds, "time_to_best": self.time_to_best,
                "history": [list(h) for h in self.history], **{k: v for k, v in self.info.items()
                                                               if isinstance(v, (int, float, str, bool))}}


class Tracker:
    """Best value over time for a solver loop: ``seen(value, seconds)`` returns True when it
    improves; ``history`` and ``time_to_best`` as in :class:`Result`."""

    def __init__(self, sense: str = "max"):
        self.sense = sense
        self.best: float | None = None
        self.history: list[tuple[float, float]] = []

    def seen(self, value: float, seconds: float) -> bool:
        better = self.best is None or (value > self.best if self.sense == "max" else value < self.best)
        if better:
            self.best = value
            self.history.append((round(seconds, 3), value))
        return better

    @property
    def time_to_best(self) -> float | None:
        return self.history[-1][0] if self.history else None
