"""The algorithm contract: what every algorithm declares and exposes to the Learner,
schemes and checkpoints (``docs/algorithms.md`` walks through adding one).

The loop is::

    env_action, extras = algo.explore(obs)           # actor, no grad; extras: a NamedTuple
    next_obs, reward, term, trunc, info = env.step(env_action)
    algo.observe(Step(obs, extras, reward, term, trunc, info["final_obs"], next_obs))   # storage
    if algo.ready(): stats = algo.update(progress)   # learner

An algorithm never steps an env and never logs; it owns its actor, storage, optimizers
and targets, and returns plain metrics from ``update``.

**Declarations.** Each algorithm names its parts once, as class attributes:

* ``networks``: the ``nn.Module`` attributes (online and target networks, normalizers);
* ``optimizers``: the optimizer attributes (an attribute may be ``None``: SAC's temperature
  optimizer with a fixed coefficient);
* ``free_params``: tensors that are not in a module (SAC's ``log_alpha``);
* ``acting``: the networks a collector needs to act (and score its transitions: Ape-X TD3
  also sends its critics).

``state_dict``, ``to(device)``, the parameters sent to collectors and to gradient workers
all read these declarations; nothing scans ``vars()``. What is not a network, an optimizer
or a free parameter (storage, counters) is ``extra_state``.

**Roles.** An algorithm is built for one role: ``learner`` (everything), ``grad_worker``
(networks and optimizers: it computes gradients, stores nothing) or ``actor`` (networks
only: collectors and ``corral.load``; no replay, no rollout storage, no optimizer state).

**Hooks** that schemes and the Learner call are the methods below, each with a default, so
no caller probes an algorithm with ``hasattr``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, NamedTuple, cast

import gymnasium as gym
import torch

from corral import optim
from corral.policy import Policy, as_policy  # noqa: F401 (as_policy: re-exported, its old home)
from corral.rng import RNGStreams

Role = Literal["learner", "grad_worker", "actor"]
ROLES = ("learner", "grad_worker", "actor")


class Step(NamedTuple):
    """One vector step as ``observe`` takes it; every tensor has the env dim ``N`` first."""

    obs: torch.Tensor
    extras: Any  # what ``explore`` returned besides the env action: a NamedTuple of tensors
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor  # bootstrap here: the env truncated, or a fragment ends (schemes)
    final_obs: torch.Tensor  # the true next observation (``next_obs`` except where an episode ended)
    next_obs: torch.Tensor  # what the policy sees next (a reset observation where an episode ended)
    # Where ``truncated`` also marks a fragment's last step: the env's own truncation flags
    # (None: ``truncated`` is the env's). Episode state (PPO's discounted return for reward
    # scaling) follows the env's episodes, not fragments.
    env_truncated: torch.Tensor | None = None
    # A multi-agent env's per-agent rewards and flags ``[N, A]`` (``corral.envs.multiagent.AgentStep``,
    # ``info["agents"]``); None for single-agent envs
    agents: Any = None

    def episode_ended(self) -> torch.Tensor:
        """Where the env's episode ended in this step (terminated or truncated by the env)."""
        return self.terminated | (self.truncated if self.env_truncated is None else self.env_truncated)


class Action(NamedTuple):
    """The extras of an algorithm that stores only the action it took (the replay family)."""

    action: torch.Tensor


def stack_records(records: list) -> Any:
    """A list of per-step extras records -> one record of ``[T, ...]`` tensors."""
    return type(records[0])(*(torch.stack(parts) for parts in zip(*records)))


def index_record(record: Any, t) -> Any:
    """Step ``t`` (an int or an index) of a record of stacked tensors."""
    return type(record)(*(v[t] for v in record))


def map_record(record: Any, fn) -> Any:
    return type(record)(*(fn(v) for v in record))


class RecurrentPolicy(Policy):
    """A recurrent algorithm's policy with its state per env copy: zeros where an episode
    starts (the first call, and after ``episodes_ended``), carried between calls otherwise."""

    def __init__(self, algo: "Algorithm", deterministic: bool = True):
        self.algo, self.deterministic = algo, deterministic
        self.state: torch.Tensor | None = None
        self.starts: torch.Tensor | None = None

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        n = obs.shape[0]
        if self.state is None or self.state.shape[0] != n:
            self.state = self.algo.initial_state(n)
            self.starts = torch.ones(n, dtype=torch.bool, device=self.state.device)
        starts = cast(torch.Tensor, self.starts)  # set with the state above
        action, self.state = self.algo.act_recurrent(obs, self.state, starts, self.deterministic)
        self.starts = torch.zeros_like(starts)
        return action

    def episodes_ended(self, ended: torch.Tensor) -> None:
        if self.starts is not None:
            self.starts = ended.to(self.starts.device, torch.bool).reshape(self.starts.shape)


class Algorithm:
    name: ClassVar[str]
    Config: ClassVar[type]
    value_method = False  # acts greedily on learned action values (evaluation protocols read it)
    networks: ClassVar[tuple[str, ...]] = ("actor",)
    optimizers: ClassVar[tuple[str, ...]] = ()
    free_params: ClassVar[tuple[str, ...]] = ()
    acting: ClassVar[tuple[str, ...]] = ("actor",)
    # Ape-X: with collectors, transitions go to a replay server, not through ``observe``
    replay_server: ClassVar[bool] = False
    # what that server stores: "transitions" or "sequences" (R2D2; ``corral.schemes.replay_server.SERVERS``)
    replay_items: ClassVar[str] = "transitions"
    # acts from a recurrent state (``initial_state``, ``act_recurrent``; ``policy`` keeps it)
    recurrent: ClassVar[bool] = False
    # takes multi-agent envs (packed observations with an agent layout: corral.envs.multiagent)
    multi_agent: ClassVar[bool] = False
    # with collectors, fragments carry the per-agent results (Step.agents) this algorithm's observe reads
    multi_agent_collectors: ClassVar[bool] = False
    # how gradient workers (scheme.grad_workers > 1) split an update (corral.schemes.grad.sharded_class):
    # "minibatches" (PPO's loop), "steps" (the replay family's gradient steps), None: not wired, and
    # grad_sharding_note says why where the class knows
    grad_sharding: ClassVar[str | None] = None
    grad_sharding_note: ClassVar[str] = ""
    actor: Any  # a torch.nn.Module with act(obs, deterministic, generator); the family's own class
    total_steps: int = 1  # the run's step budget, set by the Learner; drives schedules like epsilon

    def __init__(self, cfg: Any, obs_space: gym.Space, act_space: gym.Space, num_envs: int,
                 device: torch.device, rng: RNGStreams, role: Role = "learner"):
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.cfg = cfg
        self.obs_space = obs_space
        self.act_space = act_space
        self.num_envs = num_envs
        # the num_envs to build this algorithm again with (a multi-agent algorithm's num_envs counts its
        # N * A agent columns; it sets this to N)
        self.env_columns = num_envs
        self.device = device
        self.rng = rng
        self.role = role

    def ensemble_vote(self) -> str | None:
        """How an ensemble (``corral.population.ensemble``) combines this algorithm's votes:
        ``"q"`` (its actor's ``q(obs)``, averaged), ``"probs"`` (a categorical policy's
        probabilities), ``"action"`` (a continuous policy's deterministic action), or None."""
        if self.value_method:
            return "q" if callable(getattr(self.actor, "q", None)) else None
        return "action" if isinstance(self.act_space, gym.spaces.Box) else None

    @property
    def learns(self) -> bool:
        """Built with optimizers (learner, gradient worker)."""
        return self.role != "actor"

    @property
    def stores(self) -> bool:
        """Built with its rollout storage or replay buffer (learner only)."""
        return self.role == "learner"

    # --- the loop. explore and observe run under torch.no_grad(), entered once per step by
    # the Learner; update runs with gradients enabled.
    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(env action, extras record)`` for a batch of observations."""
        raise NotImplementedError

    def observe(self, step: Step) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def update(self, progress: float) -> dict[str, float]:
        """One learning step; ``progress`` in [0, 1] drives schedules."""
        raise NotImplementedError

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actor.act(obs, deterministic=deterministic, generator=self.rng["action"])

    def episodes_ended(self, ended: torch.Tensor) -> None:
        """Where the env's episodes ended at the step just taken (``terminated | truncated`` as
        the env reports them), so the next observation of those columns starts a new episode.
        The loops that call ``explore`` (the Learner, collectors) say it after every step; a
        recurrent algorithm resets its state there."""

    def rewarded(self, reward: torch.Tensor) -> None:
        """The env's rewards ``[N]`` for the step just taken, said by the same loops before
        ``episodes_ended`` (NGU conditions its next action on the previous reward)."""

    def step_hooks(self) -> tuple[Any, Any]:
        """``(rewarded, episodes_ended)`` bound, or None for each this class leaves as the base's
        no-op, so the Learner's loop skips calling it."""
        kind = type(self)
        return (self.rewarded if kind.rewarded is not Algorithm.rewarded else None,
                self.episodes_ended if kind.episodes_ended is not Algorithm.episodes_ended else None)

    def unfilled_bytes(self) -> int:
        """Bytes the algorithm's storage will still take as it fills (a replay buffer's empty
        slots); ``corral bench --dry-run`` adds them to a probe's memory. 0 by default."""
        return 0

    def policy(self, deterministic: bool = True) -> Policy:
        """What evaluation and video act with (a recurrent algorithm's keeps its state)."""
        return Policy(lambda obs: self.act(obs, deterministic=deterministic))

    # --- recurrent algorithms (``recurrent = True``) implement these
    def initial_state(self, batch: int) -> torch.Tensor:
        """The recurrent state of ``batch`` new episodes ``[batch, state_dim]``."""
        raise TypeError(f"{self.name} is not recurrent: it has no state")

    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor,
                      deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(env actions, new state)`` from ``state``, reset where ``starts``."""
        raise TypeError(f"{self.name} is not recurrent: act with act(obs)")

    def export_policy(self) -> torch.nn.Module:
        """The deterministic policy ``corral export`` writes (``corral/export.py``): a module
        from raw flat observations to env actions, the normalizer and action scaling inside.
        The default wraps ``actor.act(obs, deterministic=True)``. A recurrent policy returns a
        module with ``state_specs`` (one ``corral.actors.policy.StateSpec`` per state tensor) whose
        ``forward(obs, *state)`` returns ``(action, *next_state)``; until a recurrent algorithm
        overrides this, exporting one is refused (its ``act`` has no state)."""
        from corral.actors.policy import DeterministicPolicy

        if self.recurrent:
            from corral.errors import UserError

            raise UserError(f"exporting {self.name} (a recurrent policy) is not built yet: it needs its state as "
                            "inputs and outputs, through Algorithm.export_policy with state_specs "
                            "(docs/export.md); feed-forward algorithms export today")

        return DeterministicPolicy(self.actor)

    @property
    def at_boundary(self) -> bool:
        """True where a checkpoint holds everything (e.g. an empty rollout)."""
        return True

    # --- hooks for schemes (defaults fit an algorithm that needs nothing special)
    def fragment_length(self) -> int:
        """Env steps per env in a collector's fragment."""
        return 64

    def scheme_config(self, collectors: int) -> dict[str, Any]:
        """Config changes for the learner's copy when ``collectors`` collectors feed it
        (a rollout algorithm holds one fragment of each per update)."""
        return {}

    def set_worker(self, index: int, count: int) -> None:
        """A collector's place among ``count`` (Ape-X's exploration ladders)."""

    def set_env_steps(self, env_steps: int) -> None:
        """A collector hears the run's env steps before each fragment (schedules, warm-up)."""

    def initial_priorities(self, fragment) -> torch.Tensor | None:
        """``[T, N]`` replay priorities a collector computes for its fragment, or None."""
        return None

    def column_state(self) -> dict[str, torch.Tensor]:
        """Per-env state that follows the episodes in the learner's env columns (PPO's
        discounted return for reward scaling). A scheme that feeds several collectors'
        fragments through the same columns keeps one per collector and swaps it in."""
        return {}

    def load_column_state(self, state: dict[str, torch.Tensor]) -> None:
        for k, v in state.items():
            getattr(self, k).copy_(v)

    def collector_state(self) -> dict[str, torch.Tensor]:
        """What a collector needs to act: the ``acting`` networks' state, flat."""
        if self.acting == ("actor",):
            return self.actor.state_dict()
        return {f"{name}.{k}": v for name in self.acting for k, v in getattr(self, name).state_dict().items()}

    def load_collector_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.acting == ("actor",):
            self.actor.load_state_dict(state)
            return
        for name in self.acting:
            prefix = name + "."
            getattr(self, name).load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})

    # --- declarations read
    def declared_networks(self) -> list[torch.nn.Module]:
        return [getattr(self, name) for name in self.networks]

    def declared_optimizers(self) -> list:
        """Every optimizer that exists, in declaration order (gradient workers name them by index).
        One not built yet is left out (a base class's ``__init__`` runs before its subclass builds them)."""
        if not self.learns:
            return []
        return [opt for opt in (getattr(self, name, None) for name in self.optimizers) if opt is not None]

    def synced_tensors(self) -> list[torch.Tensor]:
        """Every tensor a gradient step reads: parameters and buffers of all networks
        (targets and normalizers included) and the free parameters."""
        out: list[torch.Tensor] = []
        for net in self.declared_networks():
            out += list(net.parameters()) + list(net.buffers())
        return out + [getattr(self, name) for name in self.free_params]

    def to(self, device: torch.device | str) -> "Algorithm":
        """Move an acting copy (role ``actor``) to ``device``. A learner's optimizers hold
        its parameters in flat buffers; it is rebuilt on the device and loaded instead
        (``corral resume --device``)."""
        if self.learns:
            raise RuntimeError("Algorithm.to moves acting copies; build a learner on its device and load its state")
        self.device = torch.device(device)
        for net in self.declared_networks():
            net.to(self.device)
        with torch.no_grad():
            for name in self.free_params:
                setattr(self, name, getattr(self, name).to(self.device))
        return self

    # --- state
    def extra_state(self) -> dict[str, Any]:
        """State that is not a declared network, optimizer or free parameter."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: getattr(self, name).state_dict() for name in self.networks}
        for name in self.free_params:
            state[name] = getattr(self, name).detach().clone()
        for name in self.optimizers if self.learns else ():
            opt = getattr(self, name)
            if opt is not None:
                state[name] = opt.state_dict()
        state.update(self.extra_state())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's algorithm state; an acting copy takes only what acting needs."""
        for name in self.networks:
            getattr(self, name).load_state_dict(state[name])
        with torch.no_grad():
            for name in self.free_params:
                getattr(self, name).copy_(state[name])
        for name in self.optimizers if self.learns else ():
            opt = getattr(self, name)
            if opt is not None:
                # the moments and step counts come from the checkpoint; lr, betas and eps stay as this
                # config built them, so `corral resume --set sac.lr=...` (and PBT's explore) take effect
                fresh = optim.hyperparameters(opt)
                opt.load_state_dict(state[name])
                optim.set_hyperparameters(opt, fresh)
        self.load_extra_state(state)
