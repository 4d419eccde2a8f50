"""A replay algorithm's gradient step captured as a CUDA graph and replayed (``cuda_graph``).

On a GPU, a gradient step of RL-sized networks is bound by the host launching a few hundred
small kernels, not by the arithmetic (``benchmarks/bench_gpu_step.py``). A CUDA graph records
the step's kernels once and replays them with one launch. What that needs, and where it is:

* **static inputs**: every step's batch (and DQN's shared target rows) is copied into buffers
  allocated once, and its noise is drawn as the eager step draws it (``draw_noise``, the
  learner's streams, outside the graph) and copied into buffers too, so the random streams
  and what they give are the eager path's;
* **no host reads inside the step**: ``phases`` and ``after_step`` branch only on host values
  (counters, config), and those decisions are the algorithm's ``graph_key``: one graph per
  key (SAC: whether the actor steps, whether the targets move). ``FlatAdam.capturable``
  counts its steps on the device. Metrics stay device tensors, cloned after each replay;
* **the Polyak target update** (``after_step``) is inside the captured region.

``GraphedStep(algo, capture=False)`` is the same code with graphs off: each step fills the
static buffers and runs the step eagerly on them. ``tests/test_cuda_graph.py`` checks that it
leaves every parameter bit for bit where the regular update does (CPU, fixed seed), and on
a GPU that the replayed graph matches it.

Limits: uniform replay only (prioritized sampling reads the previous step's priorities, a
host round trip per step), an algorithm must declare ``capturable`` (its step verified by
that test), the optimizers must be ``FlatAdam`` on a torch with its fused kernel (2.4+).
A changed learning rate (or other optimizer setting) drops the graphs and captures afresh.
The graphed step is ``phases`` + ``after_step``, the reference: a speed path that overrides
``train_step`` (the value family's step without autograd, ``corral/kernels/direct.py``) is not
what runs in the graph, and the CPU test holds the two to the same numbers. Not verified yet: ``matmul=bfloat16`` with a CNN (autocast
inside a capture).
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from corral.errors import UserError
from corral.optim import _FUSED, FlatAdam


def refusal(algo) -> str | None:
    """Why ``algo``'s update cannot be captured, or None."""
    cfg = algo.cfg
    if not algo.capturable:
        return (f"{algo.name}'s gradient step, as built, is not declared capturable (the class's ``capturable``; "
                "gradient workers never are)")
    if algo.replay_server or not algo.replay_by_name:
        return f"{algo.name} keeps its own replay (a server, or sequences), sampled outside the learner's update"
    if cfg.prioritized:
        return "prioritized replay samples each step from the priorities the previous step wrote (a host round trip)"
    if cfg.lr_schedule != "constant":
        return "a learning-rate schedule changes the optimizers' rate every update (a capture each time)"
    if not _FUSED:
        return f"torch {torch.__version__} has no fused Adam kernel (torch 2.4 or later)"
    if any(not isinstance(opt, FlatAdam) for opt in algo.declared_optimizers()):
        return "its optimizers are not FlatAdam"
    return None


def check(algo) -> None:
    """Refuse ``cuda_graph=on`` where it cannot apply (at construction, before any env step)."""
    if algo.cfg.cuda_graph != "on" or not algo.learns:
        return
    why = refusal(algo)
    if why is None and algo.device.type != "cuda":
        why = f"CUDA graphs need device=cuda, this run is on {algo.device}"
    if why is not None:
        raise UserError(f"{algo.name}.cuda_graph=on: {why}; set {algo.name}.cuda_graph=auto (graphs where "
                        "the device is a GPU and the update allows them, else the eager update) or off")


def make(algo) -> GraphedStep | None:
    """The graphed step ``algo``'s option asks for: on a CUDA device unless ``off`` or refused."""
    mode = algo.cfg.cuda_graph
    if mode == "off" or not algo.learns or algo.device.type != "cuda" or refusal(algo) is not None:
        return None
    return GraphedStep(algo, capture=True)


def _like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _hyper(opt) -> tuple:
    return (opt.lr, opt.betas, opt.eps, opt.max_grad_norm)


class GraphedStep:
    """``train_step`` on static buffers: captured and replayed (``capture``), or run eagerly."""

    warmup = 3  # eager steps per key before its capture: lazy initialisations (cuBLAS, autograd) happen first

    def __init__(self, algo, capture: bool = True):
        self.algo, self.capture = algo, capture
        self.opts = algo.declared_optimizers()
        for opt in self.opts:
            opt.capturable = True
        self.batch = None
        self.shared: torch.Tensor | None = None
        self.noise: dict[str, torch.Tensor] = {}
        self.graphs: dict = {}  # key -> (graph, stats, td)
        self.seen: collections.Counter = collections.Counter()
        self.hyper: list[tuple] = []

    def __deepcopy__(self, memo):
        """A copy for the copied algorithm, with nothing captured (graphs point at this one's memory)."""
        return GraphedStep(memo.get(id(self.algo), self.algo), self.capture)

    def reset(self) -> None:
        """Drop every captured graph (new buffers, or optimizer settings changed)."""
        self.graphs.clear()
        self.seen.clear()

    def _fill(self, batch, shared, noise) -> None:
        """Copy a step's inputs into the static buffers (allocated at the first step, or anew
        where a shape changed)."""
        if self.batch is None or self.batch.obs.shape != batch.obs.shape:
            self.batch = dataclasses.replace(batch, **{f.name: _like(getattr(batch, f.name))
                                                        for f in dataclasses.fields(batch)})
            self.shared, self.noise = None, {}
            self.reset()
        for f in dataclasses.fields(batch):
            getattr(self.batch, f.name).copy_(getattr(batch, f.name))
        if shared is not None:
            if self.shared is None or self.shared.shape != shared.shape:
                self.shared = _like(shared)
                self.reset()
            self.shared.copy_(shared)
        for k, v in noise.items():
            buf = self.noise.get(k)
            if buf is None or buf.shape != v.shape:
                buf = self.noise[k] = _like(v)
                self.reset()
            buf.copy_(v)

    def _run(self, noise_keys, shared: bool):
        """The step on the static buffers, eagerly (or being captured)."""
        noise = {k: self.noise[k] for k in noise_keys}
        return self.algo.run_step(self.batch, noise, self.shared if shared else None)

    def __call__(self, batch, shared=None):
        """One gradient step on ``batch``: (metrics as 0-dim tensors, |TD errors| or None)."""
        algo = self.algo
        noise = algo.draw_noise(batch.obs.shape[0])
        self._fill(batch, shared, noise)
        args = (tuple(noise), shared is not None)
        if not self.capture:
            return self._run(*args)
        hyper = [_hyper(opt) for opt in self.opts]
        if hyper != self.hyper:  # a schedule or a callback moved the learning rate: the graphs hold the old one
            self.hyper = hyper
            self.reset()
        key = (algo.graph_key(), args)
        entry = self.graphs.get(key)
        if entry is None:
            if self.seen[key] < self.warmup:
                self.seen[key] += 1
                return self._side_stream(*args)
            entry = self.graphs[key] = self._capture(*args)
        graph, stats, td = entry
        graph.replay()
        return {k: v.clone() for k, v in stats.items()}, (None if td is None else td.clone())

    def _side_stream(self, *args):
        """An eager step on a side stream, as torch.cuda.graphs' docs ask before a capture."""
        device = self.algo.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            out = self._run(*args)
        torch.cuda.current_stream(device).wait_stream(stream)
        return out

    def _capture(self, *args):
        """Record the step (nothing runs while recording: the caller replays it at once)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads may use CUDA
            stats, td = self._run(*args)
        return graph, stats, td
