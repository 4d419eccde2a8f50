"""A replay buffer as a service (Ape-X): collectors' fragments go in with the priorities
the collectors computed, the learner samples batches and sends back new priorities.

``ReplayServer`` is a plain object; the Ray scheme runs it in an actor, and in-process
runs (``LocalPool``, tests) call it directly. Either way the learner sees it through one
``ReplayClient``, so the pipelining below is the same code in both. The buffer is the
same ``PrioritizedReplayBuffer`` an in-process run uses, with the same layout (one column
per env of a collector), so its ``state_dict`` goes into checkpoints unchanged and a run
resumes in either mode.

**Batches in groups.** The learner asks for ``prefetch`` batches per request and keeps the
next request in flight while it trains on the current group, so it pays one round trip
per group and never waits for the server's sampling. The request carries the priorities
of every batch trained since the last one, and the server applies them before it draws
(Ape-X's learner: prefetched batches, priorities sent back asynchronously). A group is one
stratified draw of ``prefetch x batch_size`` slots in random order, cut into batches:
sampling costs about the same for one batch as for sixteen (~1 ms on CPU here), so the
server keeps up with the learner. The price is staleness: a group is drawn before the
priorities of the group being trained (and, for the first request, of none) have landed,
so priorities are 1 to 2 groups old when they steer sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from corral.envs.spaces import frame_stack_of
from corral.rng import set_generator_state
from corral.schemes.collector import FragmentData
from corral.storage.prioritized import PrioritizedReplayBuffer
from corral.storage.replay import ReplayBatch, ReplayBuffer


class ReplayRestarted(Exception):
    """The replay server died during an update and its replacement (from the last checkpoint,
    or empty before the first) holds less than a batch: the update in flight cannot draw and
    is given up; the learner trains again once the collectors have refilled it."""


class Ready:
    """A server result already in hand (a restored prefetched group), where a handle would be."""

    def __init__(self, value):
        self.value = value


def batch_fields(batch) -> dict:
    return {f.name: None if getattr(batch, f.name) is None else getattr(batch, f.name).cpu()
            for f in dataclasses.fields(batch)}


def batch_to(batch, device):
    return type(batch)(**{f.name: None if getattr(batch, f.name) is None
                          else getattr(batch, f.name).to(device, non_blocking=True) for f in dataclasses.fields(batch)})


class ReplayServer:
    batch_cls = ReplayBatch
    counts_rows = True  # a fragment of T steps of N envs adds T * N items (a client can count them itself)

    def __init__(self, algo_cfg, num_envs: int, obs_space, act_space, seed: int):
        torch.set_num_threads(1)
        c = algo_cfg
        self.cfg = c
        kw = dict(device="cpu", seed=seed, n_step=c.n_step, gamma=c.gamma, frame_stack=frame_stack_of(obs_space))
        if c.prioritized:
            self.buffer = PrioritizedReplayBuffer(c.buffer_size, num_envs, obs_space, act_space, alpha=c.per_alpha,
                                                  beta=c.per_beta, beta_final=c.per_beta_final, eps=c.per_eps, **kw)
        else:
            self.buffer = ReplayBuffer(c.buffer_size, num_envs, obs_space, act_space, **kw)
        self.num_envs = num_envs
        self._order = torch.Generator().manual_seed(int(seed) + 1)  # shuffles a group's draw into batches

    def add(self, data: FragmentData, rows: int | None = None, source: Any = None) -> int:
        """Append a fragment (or its first ``rows`` steps; the last one is a boundary) and
        set its initial priorities. ``source``: ``(collector, generation)`` it came from."""
        if rows is not None:
            data = data.head(rows)
        buf = self.buffer
        start = buf.steps_added
        final = data.true_next_obs()
        trunc = data.boundary_truncated()
        action = data.extras.action
        T = data.length
        for t in range(T):
            buf.add(data.obs[t], action[t], data.reward[t], data.terminated[t], trunc[t], final[t])
        if data.priorities is not None and isinstance(buf, PrioritizedReplayBuffer) and T <= buf.capacity_per_env:
            rows = (start + torch.arange(T)) % buf.capacity_per_env
            idx = (rows[:, None] * self.num_envs + torch.arange(self.num_envs)).reshape(-1)
            buf.update_priorities(idx, data.priorities.reshape(-1))
        return len(buf)

    def sample(self, batch_size: int, step: int, beta_steps: int) -> ReplayBatch:
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            self.buffer.step, self.buffer.beta_steps = step, beta_steps
        return self.buffer.sample(batch_size)

    def sample_group(self, batch_size: int, count: int, step: int, beta_steps: int) -> ReplayBatch:
        """``count`` batches as one batch of ``count x batch_size`` rows: one stratified draw
        in random order, so every consecutive ``batch_size`` rows are a batch drawn from the
        whole priority distribution (not from one slice of the sum tree)."""
        batch = self.sample(batch_size * count, step, beta_steps)
        if count > 1:
            order = torch.randperm(batch_size * count, generator=self._order)
            batch = type(batch)(**{f.name: None if getattr(batch, f.name) is None else getattr(batch, f.name)[order]
                                   for f in dataclasses.fields(batch)})
        return batch

    def exchange(self, indices, td_errors, batch_size: int, count: int, step: int, beta_steps: int) -> ReplayBatch:
        """The learner's one call per group: apply the priorities it learned (if any), then
        draw its next ``count`` batches."""
        if indices is not None:
            self.update_priorities(indices, td_errors)
        return self.sample_group(batch_size, count, step, beta_steps)

    def update_priorities(self, indices, td_errors) -> None:
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            self.buffer.update_priorities(indices, td_errors)

    def size(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict:
        """The buffer's state (what an in-process buffer loads: rows, sum tree, max priority,
        beta step, its RNG) and, under ``"server"``, the server's own stream."""
        return {**self.buffer.state_dict(), "server": {"order": self._order.get_state()}}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)
        server = state.get("server") or {}
        if "order" in server:
            set_generator_state(self._order, server["order"])

    @staticmethod
    def check_td(td: torch.Tensor) -> None:
        """The learner checks what it sends (a remote failure would surface late)."""
        if not bool(torch.isfinite(td).all()):
            raise ValueError("update_priorities got non-finite TD errors; the loss has diverged: check the "
                             "learning rate, reward scale and target network update.")


class ReplayClient:
    """The learner's view of a ``ReplayServer``: what ``OffPolicy.update`` calls on a replay
    buffer (``add``, ``can_sample``, ``sample``, ``update_priorities``, state).

    ``call(name, *args)`` starts a server method and returns a handle, ``get(handle)`` its
    result: Ray's ``actor.name.remote`` and ``ray.get`` for a server in an actor, a direct
    call and the identity in this process. Server calls run in the order they are made, so
    both see the same sequence of adds, priority updates and draws. Batches come
    ``prefetch`` at a time with the next group's request in flight (module docstring)."""

    def __init__(self, call: Callable[..., Any], get: Callable[[Any], Any], device, capacity: int, prefetch: int = 1,
                 server_cls: type | None = None):
        self.call, self.get, self.device, self.capacity = call, get, device, capacity
        server_cls = server_cls or ReplayServer
        self.batch_cls, self.counts_rows = server_cls.batch_cls, server_cls.counts_rows
        self.prefetch = max(1, int(prefetch))
        self.step = 0
        self.beta_steps = 1
        self.size = 0
        self._queue: list[ReplayBatch] = []
        self._next = None  # (handle, batch_size) of the request in flight
        self._updates: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sent = 0  # transitions sent to the server over the run (what a restart counts its loss against)
        # ``revive(error)``: called when a result shows the server failed; it replaces the
        # server (``replace``) or raises. None (in-process): the error propagates.
        self.revive: Callable[[BaseException], None] | None = None
        # Adds whose results were not read yet, (handle, transitions), kept when ``done(handles)``
        # (which of them have run; Ray: ``ray.wait``) is set. An add that failed because its
        # fragment never reached the server (``lost(error)``: the node holding it went away) is
        # taken off ``sent``, counted in ``dropped`` and reported to ``on_drop``.
        self._adds: list[tuple[Any, int]] = []
        self.done: Callable[[list], list] | None = None
        self.lost: Callable[[BaseException], bool] = lambda e: False
        self.on_drop: Callable[[int], None] | None = None
        self.dropped = 0

    def _result(self, handle, remake: Callable[[], Any], need: int = 0):
        """``get(handle)``; when the server died meanwhile, revive it and ask again (``remake``);
        ``need``: items the request draws, which a revived server that holds fewer cannot give
        (``ReplayRestarted``)."""
        while True:
            try:
                return handle.value if isinstance(handle, Ready) else self.get(handle)
            except Exception as e:  # noqa: BLE001 - revive decides what is a death and what is not
                if self.revive is None:
                    raise
                self.revive(e)
                if self.size < need:
                    raise ReplayRestarted(f"the restarted replay server holds {self.size} items, "
                                          f"fewer than a batch of {need}") from None
                handle = remake()

    def replace(self, call: Callable[..., Any], state: dict | None) -> int:
        """A new server behind this client, loaded with ``state`` (a snapshot of the old one's,
        the learner's last checkpoint) or empty. What the dead one held since is gone: the
        batches drawn ahead, the priorities not yet applied, the transitions sent after the
        snapshot. Returns how many transitions were lost."""
        self.call = call
        self._queue, self._next, self._updates, self._adds = [], None, [], []
        kept = 0
        if state is not None:
            client = (state.get("server") or {}).get("client") or {}
            server = {k: v for k, v in (state.get("server") or {}).items() if k not in ("client", "windows")}
            # a sequence server's windows restart with the collectors' next fragments (no gap stitched over)
            self.get(self.call("load_state_dict", {**state, "server": server}))
            kept = int(client.get("sent", 0))
        self.size = int(self.get(self.call("size")))
        return max(0, self.sent - kept)

    def add(self, data, rows: int, num_envs: int, source: Any = None) -> None:
        handle = self.call("add", data, rows, source)
        self.sent += rows * num_envs
        if self.done is not None:
            self._adds.append((handle, rows * num_envs))
        if self.counts_rows:
            self.size = min(self.capacity, self.size + rows * num_envs)

    def can_sample(self, batch_size: int) -> bool:
        if self.size < batch_size and not self.counts_rows:  # items per fragment vary: ask (warm-up only)
            self.size = int(self._result(self.call("size"), lambda: self.call("size")))
        return self.size >= batch_size

    def __len__(self) -> int:
        return self.size

    def _confirm(self, block: bool = False) -> None:
        """Read the adds that have run (all of them with ``block``): a fragment lost on its way
        is counted; a server that died or raised goes to ``revive`` like any other result."""
        if not self._adds:
            return
        handles = [h for h, _ in self._adds]
        finished = set(handles if block else self.done(handles))  # Ray's object refs hash by their id
        pending = []
        for i, (handle, n) in enumerate(self._adds):
            if handle not in finished:
                pending.append((handle, n))
                continue
            try:
                self.get(handle)
            except Exception as e:  # noqa: BLE001 - a lost fragment is counted; the rest is revive's
                if not self.lost(e):
                    self._adds = pending + self._adds[i:]
                    if self.revive is None:
                        raise
                    self.revive(e)  # a death: the new server starts from a snapshot (``_adds`` cleared)
                    return
                self.sent -= n
                self.dropped += n
                if self.on_drop is not None:
                    self.on_drop(n)
        self._adds = pending

    def _request(self, batch_size: int):
        self._confirm()
        if self.size < batch_size:  # the server died, seen on an add, and its replacement holds less
            raise ReplayRestarted(f"the restarted replay server holds {self.size} items, fewer than a batch "
                                  f"of {batch_size}")
        idx = td = None
        if self._updates:
            idx = torch.cat([i for i, _ in self._updates])
            td = torch.cat([t for _, t in self._updates])
            self._updates = []
        return self.call("exchange", idx, td, batch_size, self.prefetch, self.step, self.beta_steps), batch_size

    def sample(self, batch_size: int) -> ReplayBatch:
        if not self._queue:
            if self._next is None or self._next[1] != batch_size:
                self._next = self._request(batch_size)
            group = self._result(self._next[0], lambda: self._request(batch_size)[0], need=batch_size)
            self._next = self._request(batch_size)  # drawn while this group trains
            self._queue = group.split(batch_size)[::-1]
        self.step += 1
        return batch_to(self._queue.pop(), self.device)

    def update_priorities(self, indices, td_errors) -> None:
        ReplayServer.check_td(td_errors)
        self._updates.append((indices.detach().cpu(), td_errors.detach().cpu()))

    def flush(self) -> None:
        """Send priorities still held here (before the server's state is read)."""
        if self._updates:
            idx = torch.cat([i for i, _ in self._updates])
            td = torch.cat([t for _, t in self._updates])
            self._updates = []
            self.call("update_priorities", idx, td)

    def state_dict(self) -> dict:
        """The server's whole state, and what this client drew from it but has not trained on
        (the rest of the current group, the group in flight) with its step counters, so a
        mid-run checkpoint resumes on the same batches."""
        self.flush()
        self._confirm(block=True)  # ``sent`` as the server holds it
        state = self._result(self.call("state_dict"), lambda: self.call("state_dict"))
        client: dict[str, Any] = {"queue": [batch_fields(b) for b in self._queue], "next": None,
                                  "step": self.step, "beta_steps": self.beta_steps, "sent": self.sent}
        if self._next is not None:
            handle, size = self._next
            group = self._result(handle, lambda: self._request(size)[0])
            self._next = (Ready(group), size)
            client["next"], client["next_size"] = batch_fields(group), size
        state["server"] = {**state.get("server", {}), "client": client}
        return state

    def load_state_dict(self, state: dict) -> None:
        self._queue, self._next = [], None  # batches drawn from what is being replaced
        self.get(self.call("load_state_dict", state))
        client = (state.get("server") or {}).get("client")
        if client:  # a mid-run checkpoint: the batches it had drawn and not trained on yet
            self._queue = [self.batch_cls(**b) for b in client["queue"]]
            if client["next"] is not None:
                self._next = (Ready(self.batch_cls(**client["next"])), int(client["next_size"]))
            self.step, self.beta_steps = int(client["step"]), int(client["beta_steps"])
            self.sent = int(client.get("sent", 0))


class LocalReplay(ReplayClient):
    """A ``ReplayServer`` in this process, behind the same client."""

    def __init__(self, server: ReplayServer, device, capacity: int, prefetch: int | None = None):
        self.server = server
        if prefetch is None:
            prefetch = int(getattr(server.cfg, "prefetch", 1))
        super().__init__(lambda name, *args: getattr(server, name)(*args), lambda result: result, device, capacity,
                         prefetch, type(server))


class SequenceReplayServer(ReplayServer):
    """The replay server of a recurrent value method (R2D2): fragments are cut into
    overlapping sequences as they arrive, one :class:`~corral.storage.sequence.SequenceWindow`
    per collector (its columns continue across fragments; a restarted collector's window
    starts afresh), into a :class:`~corral.storage.sequence.SequenceReplay`. New sequences
    enter at the largest priority seen."""

    counts_rows = False

    def __init__(self, algo_cfg, num_envs: int, obs_space, act_space, seed: int):
        torch.set_num_threads(1)
        from corral.storage.replay import _obs_spec
        from corral.storage.sequence import SequenceBatch, SequenceReplay

        c = algo_cfg
        self.cfg, self.num_envs = c, num_envs
        self.length = c.burn_in + c.seq_len + c.n_step
        self.period = c.seq_period or c.seq_len
        self.state_dim, self.aux_dim = c.sequence_dims()  # the algorithm's config says (Agent57: two cores)
        self.obs_shape, self.obs_dtype = _obs_spec(obs_space)
        self.buffer = SequenceReplay(max(c.batch_size, c.buffer_size // self.period), self.length, self.obs_shape,
                                     self.obs_dtype, torch.long, self.state_dim, "cpu", seed, c.prioritized,
                                     c.per_alpha, c.per_beta, c.per_beta_final, c.per_eps, self.aux_dim)
        self.batch_cls = SequenceBatch
        self.windows: dict[int, tuple[int, Any]] = {}  # collector -> (generation, window)
        self._order = torch.Generator().manual_seed(int(seed) + 1)

    def _window(self, source):
        from corral.storage.sequence import SequenceWindow

        worker, generation = source if source is not None else (0, 0)
        held = self.windows.get(worker)
        if held is None or held[0] != generation:
            held = (generation, SequenceWindow(self.length, self.period, self.num_envs, self.obs_shape,
                                               self.obs_dtype, torch.long, self.state_dim, "cpu", self.aux_dim))
            self.windows[worker] = held
        return held[1]

    def add(self, data: FragmentData, rows: int | None = None, source: Any = None) -> int:
        if rows is not None:
            data = data.head(rows)
        window, ex = self._window(source), data.extras
        for t in range(data.length):  # the env's own flags: a fragment's end is no episode end here
            aux = {"aux": ex.aux[t]} if self.aux_dim else {}  # (NGU's extras record has aux)
            seqs = window.add(obs=data.obs[t], action=ex.action[t], reward=data.reward[t],
                              terminated=data.terminated[t], truncated=data.truncated[t], start=ex.start[t],
                              state=ex.state[t], **aux)
            if seqs is not None:
                self.buffer.add(seqs)
        return len(self.buffer)

    def sample(self, batch_size: int, step: int, beta_steps: int):
        self.buffer.step, self.buffer.beta_steps = step, beta_steps
        return self.buffer.sample(batch_size)

    def update_priorities(self, indices, td_errors) -> None:
        if self.buffer.prioritized:
            self.buffer.update_priorities(indices, td_errors)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["server"]["windows"] = {k: (g, w.state_dict()) for k, (g, w) in self.windows.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for k, (g, w) in ((state.get("server") or {}).get("windows") or {}).items():
            self._window((int(k), g)).load_state_dict(w)


SERVERS = {"transitions": ReplayServer, "sequences": SequenceReplayServer}  # by ``Algorithm.replay_items``
