"""The on-policy family's shared loop: rollout collection, the truncation bootstrap, GAE, reward
and advantage normalisation, the update over minibatches, its epilogue and checkpoint state.

A member composes it with its parts, each a hook with the name the loop calls:

* **the loss**: ``minibatch_loss`` (PPO's clipped surrogate, A2C's and REINFORCE's plain policy
  gradient with a value regression; gradient workers call the same method), or a whole
  ``train_minibatches`` where the update is not minibatch steps (TRPO's natural-gradient step
  and value fitting);
* **the batcher**: ``minibatch_plan`` and ``whole_batch``; here one minibatch that is the whole
  rollout, once (A2C's); PPO's is epochs x shuffled minibatches, IMPALA's env columns,
  ppo_lstm's sequences;
* **the returns**: ``prepare_batch``, GAE here (``gae_lambda``, a member's option where it
  uses this default); REINFORCE's Monte-Carlo returns and IMPALA's V-trace replace it;
* ``schedules`` (the learning rate here; PPO adds its clip range, the loss's parameter),
  ``stop_early`` (PPO's target-KL stop), ``reward_clip`` (reward scaling, off here),
  ``make_optimizer`` and ``STATS``.

``OnPolicyConfig`` holds only the options every member reads; a member's Config adds its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import torch

from corral.actors.actor_critic import ActorCritic
from corral.actors.normalizer import RunningNormalizer
from corral.actors.sde import SDEActorCritic
from corral.algos.base import Algorithm, Step
from corral.algos.sde import SDEConfig, SDEExploration, sde_options_unused
from corral.config import Activation, Schedule, option
from corral.errors import TrainingError, UserError
from corral.nets import MLP, CategoricalHead, NatureCNN
from corral.optim import scheduled
from corral.returns import gae, rollout_next_values
from corral.storage import storage_class
from corral.storage.rollout import RolloutStorage


def features_option():
    return option(None, "a feature extractor in place of the built-in encoder: 'module:callable' (or, from Python, "
                        "the class) called with the observation space, returning an nn.Module with an int out_dim; "
                        "or a built-in: " + ", ".join(BUILTIN_FEATURES))


def actor_option():
    return option(None, "a user's actor-critic in place of ActorCritic: 'module:callable' (or, from Python, the "
                        "class) called as (obs_space, act_space, algo_config), returning an nn.Module with "
                        "ActorCritic's interface (subclass corral.actors.ActorCritic to get it; docs/custom.md)")


def storage_option():
    return option(None, "the rollout storage: a name registered with corral.register_storage, or 'module:Class', "
                        "a subclass of corral.storage.RolloutStorage (None: RolloutStorage)")


def _mlp_features(obs_space) -> torch.nn.Module:
    mlp = MLP(int(math.prod(obs_space.shape)), (64,), "tanh")
    net = torch.nn.Sequential(torch.nn.Flatten(), mlp)
    net.out_dim = mlp.out_dim
    return net


# built-in feature extractors by name (``ppo.features=nature_cnn``): obs space -> module with out_dim
BUILTIN_FEATURES = {
    "mlp": _mlp_features,
    "nature_cnn": lambda space: NatureCNN(tuple(space.shape)),
}

# what the loop calls on its actor (a user's ``actor`` must provide them; ActorCritic does)
ACTOR_METHODS = ("normalize", "stored_obs", "stored_action", "explore", "act", "evaluate_actions", "value",
                 "outputs", "to_env")


@dataclass
class OnPolicyConfig:
    """The options every on-policy member reads (defaults: PPO's; a member's Config restates a
    field to change its default)."""

    n_steps: int = option(128, "env steps per env per rollout", ge=1)
    lr: float = option(3e-4, "Adam learning rate", gt=0)
    lr_schedule: Schedule = option("constant", "constant, or linear (anneal to 0 over the run)")
    schedule_steps: int | None = option(
        None, "env steps a linear schedule (lr_schedule, PPO's clip_schedule) anneals over (None: the run's "
              "steps); a run shorter than it stops partway down its schedule, as a curve read early in a longer "
              "run does (CleanRL's Atari runs anneal over 10M steps)", ge=1)
    gamma: float = option(0.99, "discount factor", ge=0, le=1)
    normalize_advantage: bool = option(True, "normalize advantages per minibatch")
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the policy and value MLPs", ge=1)
    activation: Activation = option("tanh", "hidden activation: tanh, relu, elu, silu")
    log_std_init: float = option(0.0, "initial log std of the Gaussian policy (Box actions)")
    init: Literal["orthogonal", "torch"] = option(
        "orthogonal", "the policy and value MLPs' and the Nature CNN's initialisation: orthogonal (SB3's default; "
                      "gain sqrt 2 in the CNN) or torch (PyTorch's default, SB3's ortho_init=False)")
    normalize_obs: bool = option(False, "running observation normalization (saved with the actor)")
    features: str | None = features_option()
    storage: str | None = storage_option()


def make_extractor(spec: str | None, obs_space, algo: str) -> torch.nn.Module | None:
    """The user's feature extractor ``spec`` names, built for ``obs_space`` (None: the built-in one)."""
    if spec is None:
        return None
    from corral.envs.make import _load_attr

    build = BUILTIN_FEATURES.get(spec) or _load_attr(spec, f"{algo}.features")
    module = build(obs_space)
    if not isinstance(module, torch.nn.Module) or not isinstance(getattr(module, "out_dim", None), int):
        raise UserError(f"{algo}.features={spec!r} must build an nn.Module with an int out_dim (its feature size); "
                        f"it built {type(module).__name__}")
    return module


def make_user_actor(cfg, obs_space, act_space, algo: str) -> torch.nn.Module:
    """``cfg.actor`` built as (obs_space, act_space, cfg), checked for the methods the loop calls."""
    from corral.envs.make import _load_attr

    if cfg.features is not None:
        raise UserError(f"{algo}.actor and {algo}.features are both set: a user's actor builds its own encoder; "
                        "unset one of them")
    try:
        module = _load_attr(cfg.actor, f"{algo}.actor")(obs_space, act_space, cfg)
    except TypeError as e:
        raise UserError(f"{algo}.actor={cfg.actor!r} could not be called as (obs_space, act_space, config): {e}") \
            from None
    missing = [m for m in ACTOR_METHODS if not callable(getattr(module, m, None))]
    if not isinstance(module, torch.nn.Module) or missing:
        raise UserError(f"{algo}.actor={cfg.actor!r} must build an nn.Module with ActorCritic's interface "
                        f"(missing: {', '.join(missing) or 'nn.Module'}); subclass corral.actors.ActorCritic")
    return module


def check_batch_size(name: str, batch_size: int, n_steps: int, num_envs: int) -> None:
    rollout = n_steps * num_envs
    if batch_size > rollout:
        raise UserError(f"{name}.batch_size={batch_size} is larger than the rollout n_steps*num_envs={rollout}; "
                        "lower batch_size or raise n_steps")


def gae_batch(cfg, data, last_value: torch.Tensor, whole: bool):
    """GAE over a full rollout ``data`` (``RolloutStorage.data``). Returns the flat batch,
    advantages, returns and ``whole``; where one minibatch holds the whole rollout (``whole``)
    the advantages are normalized here, once for all epochs."""
    with torch.no_grad():
        next_values = rollout_next_values(data.values, last_value, data.truncated, data.final_values)
        advantages, returns = gae(data.rewards, data.values, next_values, data.terminated,
                                  data.truncated, cfg.gamma, cfg.gae_lambda)
    adv, ret = advantages.flatten(), returns.flatten()
    if whole and cfg.normalize_advantage:
        adv = normalized(adv)
    return data.flatten(), adv, ret, whole


def normalized(adv: torch.Tensor) -> torch.Tensor:
    """Advantages scaled to mean 0 and std 1; a minibatch of one becomes 0 (its std is undefined)."""
    return (adv - adv.mean()) / (adv.std(correction=1 if adv.numel() > 1 else 0) + 1e-8)


class PPOExtras(NamedTuple):
    """What the family's ``explore`` hands to ``observe`` for each step."""

    action: torch.Tensor  # policy-space action as sampled
    log_prob: torch.Tensor  # under the behaviour policy
    value: torch.Tensor
    x: torch.Tensor  # the normalized observation the policy saw (what the rollout stores)


@dataclass
class PPOBatch:
    """One update's rollout, flat ``[T*N]``, with its advantages and returns."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    adv: torch.Tensor
    ret: torch.Tensor
    whole: bool  # one minibatch holds all of it (advantages normalized once, no shuffling)

    @property
    def size(self) -> int:
        return int(self.adv.shape[0])


class OnPolicy(Algorithm):
    """The on-policy loop. ``update`` is: ``schedules``, ``prepare_batch``, ``train_minibatches``
    over ``minibatch_plan`` (each minibatch a ``minibatch_step``: statistics first, then the
    optimizer step, so an early stop happens before the step that overshoots), and one
    epilogue (``finish``: finite check, explained variance, metrics). A member supplies its
    parts (module docstring), never the loop."""

    Config = OnPolicyConfig
    networks = ("actor", "ret_norm")
    optimizers = ("optimizer",)
    STATS: ClassVar[tuple[str, ...]]  # the loss's statistics, in the order minibatch_loss stacks them

    def __init__(self, cfg, obs_space, act_space, num_envs, device, rng, role="learner"):
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.seeds["init"])
            self.actor = self.make_actor().to(device)
        self.sde = self._sde_exploration()
        self.ret_norm = RunningNormalizer((), enabled=self.reward_clip() is not None).to(device)
        self._disc_return = torch.zeros(num_envs, device=device)
        self.optimizer = self.make_optimizer() if self.learns else None
        self.storage = None
        if self.stores:
            obs_shape, obs_dtype = self.actor.stored_obs()
            act_shape, act_dtype = self.actor.stored_action()
            storage_cls = storage_class(cfg.storage, RolloutStorage, f"{self.name}.storage")
            self.storage = storage_cls(cfg.n_steps, num_envs, obs_shape, act_shape, act_dtype, device, obs_dtype)
        self._last_obs: torch.Tensor | None = None
        self.updates = 0

    def ensemble_vote(self) -> str | None:
        if isinstance(self.actor, ActorCritic) and isinstance(self.actor.head, CategoricalHead):
            return "probs"
        return super().ensemble_vote()

    def make_actor(self) -> torch.nn.Module:
        """The actor-critic (built under the run's init seed): ``ActorCritic``. A member or a
        problem (the MaxCut node policy) returns its own module with ``ActorCritic``'s interface."""
        cfg = self.cfg
        extractor = make_extractor(cfg.features, self.obs_space, self.name)
        if getattr(cfg, "use_sde", False):  # gSDE (corral.algos.sde): PPO's and A2C's option
            try:
                return SDEActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation,
                                      cfg.normalize_obs, cfg.log_std_init, extractor=extractor, init=cfg.init,
                                      full_std=cfg.full_std, use_expln=cfg.use_expln)
            except ValueError as e:
                raise UserError(f"{self.name}.use_sde: {e}") from None
        return ActorCritic(self.obs_space, self.act_space, tuple(cfg.hidden), cfg.activation, cfg.normalize_obs,
                           cfg.log_std_init, extractor=extractor, init=cfg.init)

    def _sde_exploration(self) -> SDEExploration | None:
        """gSDE's per-env exploration matrices, redrawn at each rollout's start (``n_steps``)."""
        cfg = self.cfg
        if not isinstance(cfg, SDEConfig):
            return None
        if not cfg.use_sde:
            sde_options_unused(self.name, (("sde_sample_freq", cfg.sde_sample_freq, -1),
                                           ("full_std", cfg.full_std, True), ("use_expln", cfg.use_expln, False)))
            return None
        if not isinstance(self.actor, SDEActorCritic):
            raise UserError(f"{self.name}.use_sde: gSDE is built into PPO's and A2C's actor-critic; {self.name} "
                            "builds another actor (a user's actor class, a recurrent or multi-agent one); "
                            "set use_sde=false")
        head = self.actor.head
        return SDEExploration(head.latent_dim, head.act_dim, self.num_envs, cfg.n_steps, cfg.sde_sample_freq,
                              self.device)

    def make_optimizer(self):
        """The optimizer over the actor-critic, a flat one (``corral.optim``): gradient workers
        send gradients in its layout."""
        raise NotImplementedError

    # --- the parts a member supplies
    def reward_clip(self) -> float | None:
        """Rewards are scaled by the running std of the discounted return and clipped to +- this
        (None: raw rewards). A member with ``normalize_reward`` / ``reward_clip`` returns them."""
        return None

    def reward_clip_below(self) -> float | None:
        """The lower clip of scaled rewards, as a magnitude: ``reward_clip``'s unless a member
        says otherwise (PPO's ``reward_clip_low``, for a share of the run)."""
        return self.reward_clip()

    def schedule_progress(self, progress: float) -> float:
        """Where a linear schedule stands at the run's ``progress``: ``progress`` itself, or the
        share of ``schedule_steps`` the run's steps so far make (at most 1)."""
        steps = self.cfg.schedule_steps
        return progress if steps is None else min(1.0, progress * self.total_steps / steps)

    def schedules(self, progress: float) -> tuple[dict[str, float], Any]:
        """The learning rate at ``progress`` in [0, 1], set on the optimizer. Returns the metrics
        to log and the loss's scheduled parameter (passed to ``minibatch_loss``; None here)."""
        lr = scheduled(self.cfg.lr, self.cfg.lr_schedule, self.schedule_progress(progress))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return {"lr": lr}, None

    def whole_batch(self, rows: int) -> bool:
        """Whether one minibatch holds all ``rows`` of the rollout (advantages normalized once)."""
        return True

    def minibatch_plan(self, batch: PPOBatch):
        """The minibatches of one update, as row indices (``None``: the whole batch)."""
        yield None

    def minibatch_loss(self, obs, actions, log_probs, values, adv, ret, param, normalize_adv: bool):
        """``(loss, stats)`` of one minibatch, ``stats`` a tensor in ``STATS`` order (gradient
        workers call this too); ``param`` is what ``schedules`` returned for the loss."""
        raise NotImplementedError

    def stop_early(self, stats: torch.Tensor) -> bool:
        """Whether to stop the update before this minibatch's step."""
        return False

    # --- hooks
    def fragment_length(self) -> int:
        return self.cfg.n_steps

    def scheme_config(self, collectors: int) -> dict:
        # K collectors' fragments make one update's batch, K times the in-process one
        return {"n_steps": self.cfg.n_steps * collectors} if collectors > 1 else {}

    def column_state(self) -> dict:
        return {"_disc_return": self._disc_return.clone()} if self.reward_clip() is not None else {}

    # --- acting and storing
    def explore(self, obs):
        if self.sde is not None:
            noise = self.sde.next(self.actor.head, obs.shape[0], self.rng["action"])
            env_action, action, log_prob, value, x = self.actor.explore(obs, self.rng["action"], noise)
            return env_action, PPOExtras(action, log_prob, value, x)
        env_action, action, log_prob, value, x = self.actor.explore(obs, self.rng["action"])
        return env_action, PPOExtras(action, log_prob, value, x)

    def observe(self, step: Step):
        # No host read here: V(final_obs) of truncated steps is computed at update time, in one
        # batch (``final_values`` in ``prepare_batch``), from the normalized final observations stored densely.
        ex, reward = step.extras, step.reward
        if self.reward_clip() is not None:
            reward = self._scale_reward(reward, step.episode_ended())
        self.storage.add(obs=ex.x, actions=ex.action, log_probs=ex.log_prob, values=ex.value, rewards=reward,
                         terminated=step.terminated, truncated=step.truncated,
                         final_obs=self.actor.normalize(step.final_obs))
        self._last_obs = step.next_obs

    def _scale_reward(self, reward, done):
        self._disc_return.mul_(self.cfg.gamma).add_(reward)
        if self.actor.training:
            self.ret_norm.update(self._disc_return)
        self._disc_return.masked_fill_(done, 0.0)
        std = (self.ret_norm.var + self.ret_norm.eps).sqrt().float()
        return (reward / std).clamp(-self.reward_clip_below(), self.reward_clip())

    def ready(self) -> bool:
        return self.storage.full

    @property
    def at_boundary(self) -> bool:
        return self.storage is None or self.storage.step == 0

    # --- the update loop
    def update(self, progress: float) -> dict[str, float]:
        metrics, param = self.schedules(progress)
        batch = self.prepare_batch()
        sums, evaluated, steps, extra = self.train_minibatches(batch, param)
        self.storage.clear()
        self.updates += 1
        return {**self.finish(batch, sums, evaluated, steps), **metrics, **extra}

    def bootstrap_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V of raw observations with the current network (no gradient)."""
        with torch.no_grad():
            return self.actor.value(self.actor.normalize(obs))

    def final_values(self, truncated: torch.Tensor, final_obs: torch.Tensor) -> torch.Tensor:
        """V(final_obs) where ``truncated`` (0 elsewhere), with the current network, one forward
        over the truncated steps only."""
        out = torch.zeros(truncated.shape, device=self.device)
        if truncated.any():  # one host read per update, not per step
            with torch.no_grad():
                out[truncated] = self.actor.value(final_obs[truncated])
        return out

    def prepare_batch(self) -> PPOBatch:
        data = self.storage.data
        data.final_values.copy_(self.final_values(data.truncated, data.final_obs))
        b, adv, ret, whole = gae_batch(self.cfg, data, self.bootstrap_value(self._last_obs),
                                       self.whole_batch(data.rewards.numel()))
        return PPOBatch(b.obs, b.actions, b.log_probs, b.values, adv, ret, whole)

    def minibatch_step(self, batch: PPOBatch, idx, param):
        """``(stats, apply)``: the minibatch's statistics (a tensor in ``STATS`` order) and a
        callable that takes the optimizer step with its gradient."""
        take = (lambda t: t) if idx is None else (lambda t: t[idx])  # noqa: E731
        loss, stats = self.minibatch_loss(take(batch.obs), take(batch.actions), take(batch.log_probs),
                                          take(batch.values), take(batch.adv), take(batch.ret), param,
                                          self.cfg.normalize_advantage and not batch.whole)
        return stats, self.applier(loss)

    def applier(self, loss: torch.Tensor):
        """The callable that takes the optimizer step with ``loss``'s gradient."""
        def apply():
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()  # clips the global gradient norm where the optimizer has one, then steps

        return apply

    def train_minibatches(self, batch, param):
        """Run the plan; returns (summed stats, minibatches evaluated, optimizer steps, extra metrics)."""
        sums = torch.zeros(len(self.STATS), device=self.device)
        evaluated = steps = 0
        for idx in self.minibatch_plan(batch):
            stats, apply = self.minibatch_step(batch, idx, param)
            sums += stats
            evaluated += 1
            if self.stop_early(stats):
                break  # this minibatch's step would move the policy too far: stop before it
            apply()
            steps += 1
        return sums, evaluated, steps, {}

    def explained_variance(self, batch: PPOBatch) -> float:
        with torch.no_grad():
            var_ret = batch.ret.var()
            return (1.0 - (batch.ret - batch.values).var() / var_ret).item() if var_ret > 0 else float("nan")

    def finish(self, batch, sums: torch.Tensor, evaluated: int, steps: int) -> dict[str, float]:
        """The epilogue every member shares: mean stats, finite check, explained variance."""
        stats = dict(zip(self.STATS, (sums / max(evaluated, 1)).tolist()))
        bad = [k for k in ("pg_loss", "v_loss", "entropy") if not math.isfinite(stats[k])]
        if bad:
            raise TrainingError(
                f"{self.name}: {bad[0]} became non-finite at update {self.updates} "
                f"(pg_loss={stats['pg_loss']}, v_loss={stats['v_loss']}); lower {self.name}.lr, enable "
                f"{self.name}.normalize_obs / normalize_reward, or check the env's rewards"
            )
        return {**stats, "explained_variance": self.explained_variance(batch), "minibatches": float(steps)}

    # --- state
    def extra_state(self):
        state = {"disc_return": self._disc_return.clone(), "updates": self.updates}
        if self.storage is not None:
            state["storage"] = self.storage.state_dict()
        if self.sde is not None:
            state["sde"] = self.sde.state_dict()
        return state

    def load_extra_state(self, state):
        self._disc_return.copy_(state["disc_return"])
        if self.storage is not None:
            self.storage.load_state_dict(state["storage"])
        if self.sde is not None and "sde" in state:
            self.sde.load_state_dict(state["sde"])
        self.updates = int(state["updates"])
