"""The replay-server part of the fragment scheme (Ape-X, R2D2 with collectors): moving the
learner's replay into a server and back, the checkpoint a dead server restarts from, and the
loop that trains at the in-process replay ratio while collectors fill the server."""

from __future__ import annotations

from corral.kernels.compiled import update_mode
from corral.schemes.collector import merge_deltas


class ReplayServerParts:
    """``FragmentScheme``'s replay-server lifecycle and loop (a part of it: it reads the
    scheme's learner, pool calls and counters)."""

    def start_replay(self) -> None:
        """Move the learner's replay into a server; what it held (a resumed run) goes along."""
        algo = self.learner.algo
        local = algo.replay
        server = self.make_replay(local)
        if len(local):
            state = local.state_dict()
            if getattr(local, "server_state", None) is not None:  # a mid-run checkpoint's server state
                state["server"], local.server_state = local.server_state, None
                if getattr(local, "server_generator", None) is not None:  # as saved, not as a GPU buffer reseeded it
                    state["generator"], local.server_generator = local.server_generator, None
            server.load_state_dict(state)
            server.size = len(local)
        self._local_replay = local
        algo.replay = server

    def make_replay(self, local):
        from corral.schemes.replay_server import SERVERS, LocalReplay

        algo = self.learner.algo
        cls = SERVERS[algo.replay_items]
        server = cls(algo.cfg, algo.num_envs, algo.obs_space, algo.act_space, self.learner.rng.seeds["replay"])
        return LocalReplay(server, self.learner.device, local.capacity)

    def stop_replay(self) -> None:
        """Bring the replay back into the learner's algorithm, so the final checkpoint and
        anything after the run see every transition."""
        local = getattr(self, "_local_replay", None)
        if local is None:
            return
        algo = self.learner.algo
        try:
            local.load_state_dict(algo.replay.state_dict())
            local.server_state = None  # what the server had drawn ahead is not trained on after the run
        finally:
            algo.replay = local
            self._local_replay = None

    def replay_snapshot(self) -> dict | None:
        """The replay state of the learner's last checkpoint (``latest.pt``), or None."""
        L = self.learner
        path = L.run_dir / "checkpoints" / "latest.pt" if L.run_dir is not None else None
        if path is None or not path.is_file():
            return None
        from corral.train.checkpoint import load_checkpoint

        state = load_checkpoint(path)
        if int(state["counters"]["env_steps"]) > L.env_steps:  # not this run's (cannot be ahead of it)
            return None
        return state["algo"].get("replay")

    def _replay_server_loop(self):
        """Ape-X: fragments go to the replay server; the learner trains at the in-process
        replay ratio (``gradient_steps`` every ``train_freq`` vector steps, counted over all
        collectors) and never waits on collectors while it owes updates."""
        L, K = self.learner, self.K
        algo = L.algo
        cfg = algo.cfg
        total = L.cfg.steps
        n = L.cfg.env.num_envs
        per_fragment = self.T * n
        backlog = max(1, K * self.T // max(1, cfg.train_freq))  # updates owed before collectors pause
        first = -(-cfg.learning_starts // n)  # the first vector step an in-process run may update at

        def updates_by(vector_steps: int) -> int:
            """Updates an in-process run has made after ``vector_steps``: one at every multiple
            of train_freq from the first vector step with learning_starts env steps."""
            return max(0, vector_steps // cfg.train_freq - (first - 1) // cfg.train_freq)

        done = updates_by(algo.vector_steps)  # a resumed run made these already
        busy: set[int] = set()
        idle: set[int] = set(range(K))

        def due() -> int:
            nonlocal done
            if not algo.replay.can_sample(cfg.batch_size):
                # none owed while there is nothing to draw (as in-process, where an update needs
                # a batch; after a server restarted empty, the updates missed are not made up)
                done = updates_by(algo.vector_steps)
                return 0
            return updates_by(algo.vector_steps) - done

        while L.env_steps < total:
            for k in sorted(idle):
                if due() <= backlog and L.env_steps + len(busy) * per_fragment < total:
                    self.submit(k)
                    busy.add(k)
                    idle.discard(k)
            arrived = self.wait(timeout=None if due() <= 0 else 0)
            for k, meta, data, err in arrived:
                busy.discard(k)
                idle.add(k)
                if err is not None:
                    self.failed(k, err)
                    continue
                # the whole fragment, or as much as the step budget has room for
                rows = min(self.T, -(-(total - L.env_steps) // n))
                if rows <= 0:
                    continue
                algo.replay.add(data, rows, n, (meta.worker, meta.generation))
                self.note_fragment(meta, self.version)
                if self.fragment_callback is not None:
                    self.fragment_callback(meta, data)
                merge_deltas(algo.actor, meta.norm_deltas)
                self.count_episodes(meta, rows)
                L.add_steps(rows * n)
                algo.advance(rows * n)
            if due() > 0:
                done += 1
                stats = self._replay_update(algo, min(1.0, L.env_steps / total))
                if stats is not None:
                    self.version += 1
                    yield self.metrics(stats)
        while due() > 0:  # the updates the last fragments paid for
            done += 1
            stats = self._replay_update(algo, 1.0)
            if stats is not None:
                self.version += 1
                yield self.metrics(stats)

    def _replay_update(self, algo, progress: float) -> dict | None:
        """One update against the replay server, or None when the server died during it and
        its replacement holds less than a batch: the update is given up (counted in
        ``replay_lost_updates``; its gradient steps already taken stay) and training goes on
        once the collectors have refilled the server."""
        from corral.schemes.replay_server import ReplayRestarted

        try:
            with update_mode(self.learner.cfg):
                return algo.update(progress)
        except ReplayRestarted:
            self.replay_lost_updates += 1
            return None
