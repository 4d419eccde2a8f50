"""A run composed from parts in Python: a vector-env factory, an algorithm factory (with its
actor and storage), a scheme that places collection and gradient work, and a Learner.

The counterparts of PyTorchRL's ``VecEnv.create_factory``, ``PPO.create_factory``, ``Scheme``
and ``Learner`` (docs/tutorial.md walks through them)::

    envs = VecEnvFactory(make_env, {"size": 9}, num_envs=8, log_dir="logs/monitor")
    algo = AlgoFactory("ppo", lr=3e-3, features=MyExtractor, storage="my_storage")
    scheme = Scheme(envs, algo, collectors=2, grad_workers=1)
    learner = Learner.from_scheme(scheme, steps=100_000, run_dir="runs/mine")
    learner.start()
    while not learner.done():
        learner.step()

Each part is a small picklable record of what to build, checked when it is made (a bad key or
value fails there, naming it). The Learner turns them into the run's typed config, so a
composed run is an ordinary run: its ``config.yaml``, checkpoints, ``corral resume`` (where
the env and classes are importable by name), Ray workers that build their own copies, and the
same results as ``corral.train`` with the same settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from corral import config as C
from corral.errors import UserError

if TYPE_CHECKING:
    from corral.algos.base import Role


@dataclass(frozen=True)
class VecEnvFactory:
    """``num_envs`` copies of ``env_fn(**env_kwargs)`` stepped as one vector env.

    ``env_fn``: a Gymnasium id, ``'module:callable'``, a class or a function returning a
    ``gym.Env``. ``log_dir``: per-env episode logs (SB3 Monitor CSVs, one file per env, or per
    collector with several). ``backend``: sync, subproc (``corral.envs.BACKENDS``)."""

    env_fn: Any
    env_kwargs: dict = field(default_factory=dict)
    num_envs: int = 1
    log_dir: str | None = None
    backend: str = "sync"

    def __post_init__(self):
        from corral.envs import BACKENDS

        if isinstance(self.env_fn, str) and not self.env_fn:
            raise UserError("VecEnvFactory: env_fn is empty; give a Gymnasium id, 'module:callable' or a callable")
        if not isinstance(self.env_fn, str) and not callable(self.env_fn):
            raise UserError(f"VecEnvFactory: env_fn must be an id, 'module:callable' or a callable returning a "
                            f"gym.Env, got {type(self.env_fn).__name__}")
        if not isinstance(self.num_envs, int) or self.num_envs < 1:
            raise UserError(f"VecEnvFactory: num_envs must be an int >= 1, got {self.num_envs!r}")
        if self.backend not in BACKENDS:
            raise UserError(f"VecEnvFactory: backend {self.backend!r} is not one of {', '.join(BACKENDS)}")

    def __call__(self, device: str | torch.device = "cpu", seed: int | None = None):
        """The vector env itself (reset with ``seed`` when one is given)."""
        from corral.envs import make_vec_env

        env = make_vec_env(self.env_fn, self.num_envs, dict(self.env_kwargs), device, self.backend)
        if seed is not None:
            env.reset(seed=seed)
        return env

    def spaces(self):
        """``(observation_space, action_space)`` of one env, as ``create_factory`` returns them."""
        from corral.envs import make_vec_env

        env = make_vec_env(self.env_fn, 1, dict(self.env_kwargs), "cpu", "sync")
        try:
            return env.single_observation_space, env.single_action_space
        finally:
            env.close()

    def settings(self) -> dict[str, Any]:
        out = {"env.num_envs": self.num_envs, "env.backend": self.backend, "env.kwargs": dict(self.env_kwargs)}
        if self.log_dir is not None:
            out.update({"log.monitor_csv": True, "log.monitor_dir": str(self.log_dir)})
        return out


class AlgoFactory:
    """An algorithm by registry name with its options (the keys of ``corral list --options NAME``,
    without the section prefix). The actor and storage are options too: ``features`` (an
    ``nn.Module`` class taking the observation space, or a built-in name), ``actor`` (a class
    with ``ActorCritic``'s interface), ``storage`` (a ``RolloutStorage`` subclass or a name
    registered with ``corral.register_storage``); classes are recorded as ``module:qualname``."""

    def __init__(self, name: str, **options: Any):
        from corral.algos import get_algo

        self.name = name
        self.spec = get_algo(name)
        self.config = self.spec.cls.Config()
        if self.spec.overrides:
            C.update_from_dict(self.config, self.spec.overrides, name + ".")
        C.update_from_dict(self.config, options, name + ".")  # bad keys and values fail here, named
        self.options = dict(options)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"AlgoFactory({self.name!r}{', ' + opts if opts else ''})"

    def __call__(self, obs_space, act_space, num_envs: int = 1, device: str | torch.device = "cpu", seed: int = 0,
                 role: Role = "learner"):
        """The algorithm for these spaces (its actor, storage and optimizers built)."""
        from corral.rng import RNGStreams

        dev = torch.device(device)
        cfg = dataclasses.replace(self.config)
        return self.spec.class_for(cfg)(cfg, obs_space, act_space, num_envs, dev, RNGStreams(seed, dev), role=role)

    def settings(self) -> dict[str, Any]:
        return {f"{self.name}.{k}": v for k, v in self.options.items()}


@dataclass(frozen=True)
class Scheme:
    """Where collection and gradient work run: ``collectors`` collection workers (``collect``:
    sync, or async as fragments arrive), ``grad_workers`` gradient workers (``grad``: sync,
    equal to one process, or async); ``backend`` ray (Ray actors, on ``ray_address``'s cluster
    or a local one) or local (in this process, for debugging). One of each runs in-process."""

    envs: VecEnvFactory
    algo: AlgoFactory
    collectors: int = 1
    collect: str = "sync"
    grad_workers: int = 1
    grad: str = "sync"
    backend: str = "ray"
    ray_address: str | None = None

    def __post_init__(self):
        if not isinstance(self.envs, VecEnvFactory):
            raise UserError(f"Scheme: envs must be a VecEnvFactory, got {type(self.envs).__name__}")
        if not isinstance(self.algo, AlgoFactory):
            raise UserError(f"Scheme: algo must be an AlgoFactory, got {type(self.algo).__name__}")
        C.update_from_dict(C.SchemeConfig(), self._scheme_fields(), "scheme.")  # checked here, named

    def _scheme_fields(self) -> dict[str, Any]:
        return {"collectors": self.collectors, "collect": self.collect, "grad_workers": self.grad_workers,
                "grad": self.grad, "backend": self.backend, "ray_address": self.ray_address}

    def settings(self) -> dict[str, Any]:
        return {f"scheme.{k}": v for k, v in self._scheme_fields().items()}


__all__ = ["AlgoFactory", "Scheme", "VecEnvFactory"]
