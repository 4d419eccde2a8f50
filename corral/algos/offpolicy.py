"""What every replay-based algorithm shares: the replay buffer, the training cadence
(learning starts, train frequency, gradient steps), target-network updates, and the
checkpointed state. Each algorithm adds its networks, ``explore`` and ``phases``.

A gradient step is written once, as the generator ``phases(batch, noise, shared)``: it
yields ``(optimizer, loss)`` for each optimizer step in order (SAC: critics, actor,
temperature), whoever drives it steps that optimizer with that loss's gradient before
resuming, and it returns ``(stats, |TD errors| or None)``. In-process, ``train_step``
drives it with ``loss.backward(); optimizer.step()``. Gradient workers
(``corral.schemes.grad``) drive the same generator on shards of the batch and send the
gradients back to be averaged, so the two cannot drift apart. Random draws of a step
come from ``draw_noise`` (the learner's stream, whole batch) and side effects that are not
gradients (Polyak targets) from ``after_step``; both run on the learner only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from corral.actors.offpolicy import Critics
from corral.algos import graphed
from corral.algos.base import Algorithm, Step
from corral.config import Activation, Schedule, option
from corral.envs.spaces import frame_stack_of
from corral.errors import TrainingError, UserError
from corral.optim import FlatAdam, scheduled
from corral.storage import storage_class
from corral.storage.her import replay_options
from corral.storage.prioritized import PrioritizedReplayBuffer
from corral.storage.replay import ReplayBatch, ReplayBuffer, ReplayCapacityError


def drive(phases, step) -> Any:
    """Run a ``phases`` generator: ``step(optimizer, loss)`` at each yield; its return value."""
    try:
        optimizer, loss = next(phases)
        while True:
            step(optimizer, loss)
            optimizer, loss = phases.send(None)
    except StopIteration as stop:
        return stop.value


@dataclass
class OffPolicyConfig:
    buffer_size: int = option(1_000_000, "replay capacity in transitions (all envs together)", ge=1)
    learning_starts: int = option(100, "env steps collected before the first update", ge=0)
    batch_size: int = option(256, "transitions per gradient step", ge=1)
    train_freq: int = option(1, "update every this many vector steps", ge=1)
    gradient_steps: int = option(1, "gradient steps per update (-1: as many as vector steps since the last)",
                                 ge=1, also=(-1,))
    gamma: float = option(0.99, "discount factor", ge=0, le=1)
    tau: float = option(0.005, "Polyak coefficient for target networks (1.0: hard copy)", gt=0, le=1)
    target_update_interval: int = option(1, "target network updates: every this many env steps (DQN) or gradient steps (SAC)",
                                         ge=1)
    lr: float = option(3e-4, "Adam learning rate", gt=0)
    lr_schedule: Schedule = option(
        "constant", "constant, or linear: every optimizer's rate annealed to 0 over the run from the rate it was built "
                    "with (SB3's lin_X learning rates)")
    hidden: tuple[int, ...] = option((256, 256), "hidden layer sizes", ge=1)
    activation: Activation = option("relu", "hidden activation: relu, tanh, elu, silu")
    normalize_obs: bool = option(False, "running observation normalization (saved with the actor)")
    n_step: int = option(1, "n-step returns (stop at termination, bootstrap at truncation)", ge=1)
    prioritized: bool = option(False, "prioritized replay (proportional, sum-tree)")
    replay: str | None = option(
        None, "the replay storage by name: 'her' (hindsight goal relabelling for goal envs, her_* options), a name "
              "registered with corral.register_storage or 'module:Class' (a ReplayBuffer subclass); None: uniform "
              "(prioritized with prioritized=true)")
    her_strategy: Literal["future", "final", "episode"] = option(
        "future", "replay=her: a relabelled goal is achieved at a later step of the episode, its last, or any step")
    her_n_sampled_goal: int = option(4, "replay=her: relabelled goals per real transition k (a sample is "
                                        "relabelled with probability k / (k + 1))", ge=0)
    per_alpha: float = option(0.6, "prioritization exponent alpha", ge=0)
    per_beta: float = option(0.4, "initial importance-sampling exponent beta", ge=0, le=1)
    per_beta_final: float = option(1.0, "beta at the end of the run, reached linearly (Ape-X keeps 0.4: set both)",
                                   ge=0, le=1)
    per_eps: float = option(1e-6, "priority floor added to |TD error|", gt=0)
    max_grad_norm: float | None = option(None, "global gradient norm clip (None: off)", gt=0)
    adam_eps: float = option(1e-8, "Adam epsilon (torch's default; QR-DQN's paper: 0.01 / batch_size)", gt=0)
    save_replay: bool = option(True, "write the replay buffer into checkpoints (exact resume)")
    cuda_graph: Literal["auto", "on", "off"] = option(
        "auto", "capture the gradient step as a CUDA graph and replay it: auto (on a CUDA device, where the algorithm "
                "and options allow: uniform replay, a capturable step), on (refused where it cannot apply), off")


class OffPolicy(Algorithm):
    grad_sharding = "steps"  # gradient workers split each step's batch (not where a loss reads batch statistics)
    # the replay's reward per slot: () a scalar; (A,) one per agent (MADDPG with per-agent rewards)
    reward_shape: tuple[int, ...] = ()
    # the transition replay of _make_replay, whose storage `replay` may name (HER, ...); False where a
    # class keeps its own (sequences)
    replay_by_name: ClassVar[bool] = True
    # the gradient step can be captured as a CUDA graph (corral.algos.graphed): no host reads in
    # ``phases`` / ``after_step``, their host branches named by ``graph_key``, no global RNG
    capturable: ClassVar[bool] = False

    def __init__(self, cfg: OffPolicyConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        self.env_steps = 0
        self.vector_steps = 0
        self.grad_steps = 0
        self._since_update = 0
        self._pairs: dict = {}  # polyak's cached parameter lists
        if cfg.replay is not None and (self.replay_server or not self.replay_by_name):
            raise UserError(f"{self.name} keeps its own replay (a server, or sequences); {self.name}.replay="
                            f"{cfg.replay!r} is for the replay algorithms that learn in one process (sac, td3, dqn, ...)")
        self.replay = self._make_replay() if self.stores else None
        graphed.check(self)
        self._graphed: graphed.GraphedStep | None | bool = False  # False: not made yet (optimizers come later)
        self._lrs: tuple[list[float], list[float]] | None = None  # lr_schedule: (base rates, rates last set)

    def scheduled_lrs(self, progress: float) -> None:
        """``lr_schedule=linear``: every optimizer's rate at ``progress`` in [0, 1], annealed from
        its base: the rate it was built with, or one set on it from outside since (a resume keeps
        the config's rates, ``--set``; PBT's explore), which becomes the new base."""
        opts = self.declared_optimizers()
        if self._lrs is None:
            self._lrs = ([opt.lr for opt in opts], [opt.lr for opt in opts])
        base, last = self._lrs
        for i, opt in enumerate(opts):
            if opt.lr != last[i]:
                base[i] = opt.lr
            opt.lr = last[i] = scheduled(base[i], self.cfg.lr_schedule, progress)

    def unfilled_bytes(self) -> int:
        replay = self.replay
        if replay is None or not getattr(replay, "capacity", 0) or not hasattr(replay, "nbytes"):
            return 0
        filled = min(1.0, len(replay) / replay.capacity) if hasattr(replay, "__len__") else 0.0
        nbytes = replay.nbytes() if callable(replay.nbytes) else replay.nbytes
        return int(nbytes * (1.0 - filled))

    def _make_replay(self):
        cfg, rng = self.cfg, self.rng
        num_envs, obs_space, act_space = self.num_envs, self.obs_space, self.act_space
        kw = dict(device=self.device, seed=rng.seeds["replay"], n_step=cfg.n_step, gamma=cfg.gamma,
                  frame_stack=frame_stack_of(obs_space),  # stacked frames (Atari) are stored once each
                  reward_shape=self.reward_shape)
        try:
            if cfg.replay is not None:  # a storage by name: 'her' (corral/storage/her.py), registered or 'module:Class'
                cls = storage_class(cfg.replay, ReplayBuffer, f"{self.name}.replay")
                return cls(cfg.buffer_size, num_envs, obs_space, act_space, **kw, **replay_options(cls, cfg))
            if cfg.prioritized:
                return PrioritizedReplayBuffer(cfg.buffer_size, num_envs, obs_space, act_space,
                                               alpha=cfg.per_alpha, beta=cfg.per_beta,
                                               beta_final=cfg.per_beta_final, eps=cfg.per_eps, **kw)
            return ReplayBuffer(cfg.buffer_size, num_envs, obs_space, act_space, **kw)
        except ReplayCapacityError as e:
            raise UserError(str(e)) from None
        except ValueError as e:
            raise UserError(f"replay: {e}") from None

    # --- building blocks for subclasses
    def _build(self, fn):
        """Build networks from the run's init stream, so the same seed gives the same nets."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.rng.seeds["init"])
            return fn()

    @staticmethod
    def polyak(target: torch.nn.Module, online: torch.nn.Module, tau: float, pairs: dict | None = None) -> None:
        """target <- (1 - tau) target + tau online, in place, one foreach call. ``pairs``: a
        cache of the two modules' parameter and buffer lists (walking a module's tree costs
        ~0.1 ms, paid every gradient step otherwise; the Parameter objects never change:
        ``load_state_dict`` and the optimizers' flat buffers write into them)."""
        key = (id(target), id(online))
        lists = None if pairs is None else pairs.get(key)
        if lists is None:
            lists = (list(target.parameters()), list(online.parameters()), list(target.buffers()),
                     list(online.buffers()))
            if pairs is not None:
                pairs[key] = lists
        t, o, tbufs, obufs = lists
        with torch.no_grad():
            if tau >= 1.0:
                torch._foreach_copy_(t, o)
            else:
                torch._foreach_lerp_(t, o, tau)
            for tb, ob in zip(tbufs, obufs):
                tb.copy_(ob)

    @staticmethod
    def frozen(module: torch.nn.Module, params: list) -> list:
        """``module``'s parameters, listed once (``params`` empty: fill it), for toggling
        ``requires_grad`` every step without walking the module's tree."""
        if not params:
            params.extend(module.parameters())
        return params

    def _optimizer(self, params, lr: float) -> FlatAdam | None:
        """An optimizer for a learner or gradient worker; an acting copy has none."""
        return FlatAdam(params, lr=lr, eps=self.cfg.adam_eps, max_grad_norm=self.cfg.max_grad_norm) if self.learns else None

    @staticmethod
    def _step_optimizer(optimizer: FlatAdam, loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def normalizer(self) -> torch.nn.Module | None:
        """The obs normalizer that collection updates (the actor's)."""
        return None

    def target_update(self) -> None:
        """Called every ``target_update_interval`` env steps."""

    def draw_noise(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The random tensors one gradient step uses, rows per transition, drawn from the
        learner's streams in the order the step uses them."""
        return {}

    def phases(self, batch: ReplayBatch, noise: dict[str, torch.Tensor], shared: torch.Tensor | None = None):
        """One gradient step as a generator of ``(optimizer, loss)``; returns (metrics as
        0-dim tensors, new |TD errors| for PER or None). Every loss is a mean over the
        batch's rows, so a gradient over all rows is the row-weighted mean of the gradients
        over any split of them."""
        raise NotImplementedError

    def after_step(self, stats: dict[str, torch.Tensor]) -> None:
        """What a gradient step does besides optimizer steps (targets); before ``grad_steps`` counts it."""

    def graph_key(self) -> tuple:
        """The host decisions that pick which ops the next gradient step runs (SAC: whether the
        actor steps, whether the targets move); a captured graph per value (``capturable``)."""
        return ()

    def _step_fn(self):
        """The learner's gradient step: the graphed one where ``cuda_graph`` applies, else ``train_step``."""
        if self._graphed is False:
            self._graphed = graphed.make(self)
        return self._graphed or self.train_step

    def train_step(self, batch: ReplayBatch, shared: torch.Tensor | None = None):
        """One gradient step; returns (metrics as 0-dim tensors, new |TD errors| for PER or None)."""
        return self.run_step(batch, self.draw_noise(batch.obs.shape[0]), shared)

    def run_step(self, batch: ReplayBatch, noise: dict[str, torch.Tensor], shared: torch.Tensor | None = None):
        """One gradient step with its noise drawn: the phases driven, then ``after_step`` (what a
        CUDA graph captures, ``corral.algos.graphed``)."""
        stats, td = drive(self.phases(batch, noise, shared), self._step_optimizer)
        self.after_step(stats)
        return stats, td

    # --- the Algorithm interface
    def set_env_steps(self, env_steps: int) -> None:
        self.env_steps = int(env_steps)

    def observe(self, step: Step):
        norm = self.normalizer()
        if norm is not None:
            norm.update(step.obs)
        self.store(step)
        before = self.env_steps
        self.env_steps += self.num_envs
        self.vector_steps += 1
        self._since_update += 1
        interval = self.cfg.target_update_interval
        if self.env_steps >= self.cfg.learning_starts and self.env_steps // interval > before // interval:
            self.target_update()

    def store(self, step: Step) -> None:
        """Put one vector step into the replay (a sequence replay cuts it into sequences)."""
        # final_obs equals next_obs except where an episode ended: it is the true next state.
        self.replay.add(step.obs, step.extras.action, step.reward, step.terminated, step.truncated, step.final_obs)

    def ready(self) -> bool:
        cfg = self.cfg
        return (self.env_steps >= cfg.learning_starts and self.vector_steps % cfg.train_freq == 0
                and self.replay.can_sample(cfg.batch_size))

    def shared_targets(self, batch: ReplayBatch) -> torch.Tensor | None:
        """Per-transition values that every gradient step of an update can compute in one
        go, because they depend only on networks that stay fixed during the update
        (DQN: the target net's Q of ``next_obs``). One row per transition, or None."""
        return None

    def over_distinct(self, fn, batch: ReplayBatch) -> torch.Tensor:
        """``fn(batch.next_obs)``, with ``fn`` run once per distinct replay slot of ``batch``.

        An update's ``k * B`` uniform draws repeat slots (8,192 draws from 10k transitions
        hold ~5.6k distinct ones; from 50k, ~7.6k), and a slot's next observation is the same
        on every draw, so ``shared_targets``' target-net forward needs only the distinct ones.
        On CPU, where that forward is arithmetic the machine does row by row; a GPU does the
        whole batch at once, and the sort would only add launches."""
        idx, x = getattr(batch, "indices", None), batch.next_obs
        n = 0 if idx is None else idx.numel()
        if n <= 4 * self.cfg.batch_size or not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return fn(x)
        uniq, inv = torch.unique(idx, return_inverse=True)
        if uniq.numel() * 10 > n * 9:  # few repeats: the sort and the gathers would cost more
            return fn(x)
        first = torch.empty_like(uniq).scatter_(0, inv, torch.arange(n, device=idx.device))  # a draw of each
        return fn(x[first])[inv]

    def _groups(self, steps: int):
        """The transitions of one update, in groups of ``k * batch_size`` rows (``k`` steps each).

        Uniform sampling draws every step's indices at once: the buffer does not
        change between the gradient steps of an update, and one draw of ``k * B``
        indices from the replay stream is the same as ``k`` draws of ``B``, so the
        batches are the ones per-step sampling would give, gathered in one go
        (groups of at most ~16 MB of observations). Prioritized sampling depends on
        the priorities the previous step wrote, so its groups are single steps.
        """
        cfg, replay = self.cfg, self.replay
        B = cfg.batch_size
        if cfg.prioritized:
            for _ in range(steps):
                replay.step = self.env_steps
                replay.beta_steps = self.total_steps
                yield replay.sample(B)
            return
        # a remote replay (Ray) has no obs_nbytes here: its client groups requests itself
        row_bytes = max(1, 2 * getattr(replay, "obs_nbytes", 0))
        group = max(1, min(steps, (16 << 20) // (B * row_bytes)))
        done = 0
        while done < steps:
            k = min(group, steps - done)
            yield replay.sample(B * k)
            done += k

    def update(self, progress: float) -> dict[str, float]:
        cfg = self.cfg
        if cfg.lr_schedule != "constant":
            self.scheduled_lrs(progress)
        steps = cfg.gradient_steps if cfg.gradient_steps > 0 else self._since_update
        self._since_update = 0
        cols: dict[str, list[torch.Tensor]] = {}
        train_step = self._step_fn()
        for group in self._groups(steps):
            with torch.no_grad():
                shared = self.shared_targets(group)
            batches = group.split(cfg.batch_size) if group.obs.shape[0] > cfg.batch_size else (group,)
            for i, batch in enumerate(batches):
                rows = None if shared is None else shared[i * cfg.batch_size:(i + 1) * cfg.batch_size]
                stats, td = train_step(batch, rows)
                if td is not None and cfg.prioritized:
                    try:
                        self.replay.update_priorities(batch.indices, td)
                    except ValueError as e:
                        raise TrainingError(f"{self.name}: {e}") from None
                for k, v in stats.items():  # kept as tensors: no host read per gradient step
                    cols.setdefault(k, []).append(v)
                self.grad_steps += 1
        # one host read per update for all metrics: each summed over the steps that gave it, / steps
        sums = torch.stack([torch.stack(v).sum() for v in cols.values()]).tolist() if cols else []
        out = {k: x / steps for k, x in zip(cols, sums)}
        return self.checked(out)

    def checked(self, out: dict[str, float]) -> dict[str, float]:
        """An update's metrics, or an error naming the loss that became non-finite."""
        bad = [k for k in ("critic_loss", "q_loss", "actor_loss") if k in out and not math.isfinite(out[k])]
        if bad:
            raise TrainingError(
                f"{self.name}: {bad[0]} became non-finite after {self.grad_steps} gradient steps "
                f"({bad[0]}={out[bad[0]]}); lower the learning rate, enable normalize_obs, or check the env's rewards"
            )
        return out

    # --- state
    def extra_state(self) -> dict[str, Any]:
        state = {"counters": {"env_steps": self.env_steps, "vector_steps": self.vector_steps,
                              "grad_steps": self.grad_steps, "since_update": self._since_update}}
        if self.replay is not None and self.cfg.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        c = state["counters"]
        self.env_steps, self.vector_steps = int(c["env_steps"]), int(c["vector_steps"])
        self.grad_steps, self._since_update = int(c["grad_steps"]), int(c["since_update"])
        if self.replay is not None and "replay" in state:
            self.replay.load_state_dict(state["replay"])


class ActorCriticOffPolicy(OffPolicy):
    """What the actor-critic replay algorithms (TD3/DDPG, SAC) share: an actor with a Box
    head (``make_actor``, each its own) and a critics ensemble on the actor's features."""

    def make_actor(self) -> torch.nn.Module:
        raise NotImplementedError

    def make_critics(self, actor) -> torch.nn.Module:
        """The critics ensemble on the actor's features (images: a CNN of their own)."""
        cfg = self.cfg
        own = self.obs_space if actor.enc.trainable else None
        return Critics(actor.enc.dim, actor.box.dim, cfg.n_critics, tuple(cfg.hidden), cfg.activation, own)

    def make_networks(self):
        actor = self.make_actor()
        return actor.to(self.device), self.make_critics(actor).to(self.device)

    def normalizer(self):
        return self.actor.enc.norm
