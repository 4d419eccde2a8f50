"""The user surface: ``train``, ``load``, ``evaluate`` and ``Agent.act`` / ``save``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from corral import config as C
from corral.algos import get_algo
from corral.envs import make_vec_env
from corral.envs.make import env_name
from corral.rng import RNGStreams
from corral.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from corral.train.evaluate import eval_generator, evaluate_policy, resolve_protocol
from corral.train.learner import Learner
from corral.train.setup import build_config, config_from_dict, make_env, new_run_dir, resolve_device  # noqa: F401 (config_from_dict: re-exported)


class Agent:
    """A trained policy with its config; ``act`` takes numpy and returns numpy."""

    def __init__(self, algo, cfg: C.TrainConfig, run_dir: Path | None = None, state: dict | None = None,
                 summary: dict | None = None):
        self.algo = algo
        self.cfg = cfg
        self.run_dir = run_dir
        self.summary = summary or {}
        self._state = state  # the full training state when loaded from / produced by a run
        self.algo.actor.eval()
        self.obs_shape = tuple(algo.obs_space.shape)

    @property
    def actor(self) -> torch.nn.Module:
        return self.algo.actor

    def act(self, obs: Any, state: Any = None, episode_start: Any = None, deterministic: bool = True):
        """Actions for one observation ``obs_shape`` or a batch ``[B, *obs_shape]``.

        A recurrent agent (``ppo_lstm``) takes and returns its state, as sb3-contrib's
        ``RecurrentPPO.predict`` does: ``action, state = agent.act(obs, state, episode_start)``,
        ``state`` ``[B, state_dim]`` (None: new episodes, zeros) and ``episode_start`` ``[B]``
        bool, True where ``obs`` is the first of an episode (the state is reset there; None:
        True when no state is given, else False). Others return the action alone.

        A multi-agent agent (``mappo``, ``qmix``, ...) also takes one env's observations as a dict
        ``{agent: observation}`` (as PettingZoo's ``reset`` and ``step`` give them; absent agents
        left out) and returns ``{agent: action}``."""
        if isinstance(state, bool) and episode_start is None:  # act(obs, False): the old positional deterministic
            state, deterministic = None, state
        if isinstance(obs, dict) and self.algo.multi_agent:  # {agent: observation} of one env
            return self.algo.act_dict(obs, deterministic)
        arr = np.asarray(obs)
        single = arr.shape == self.obs_shape
        if not single and arr.shape[1:] != self.obs_shape:
            raise ValueError(f"act(): observation shape {arr.shape} matches neither {self.obs_shape} nor [B, *{self.obs_shape}]")
        x = torch.as_tensor(arr[None] if single else arr, device=self.algo.device)
        if x.is_floating_point():
            x = x.float()
        if not self.algo.recurrent:
            if state is not None or episode_start is not None:
                raise TypeError(f"{self.cfg.algo} is not recurrent: call act(obs) without state or episode_start")
            action = self.algo.act(x, deterministic=deterministic).cpu().numpy()
            return action[0] if single else action
        n = x.shape[0]
        if state is None:
            h = self.algo.initial_state(n)
            starts = torch.ones(n, dtype=torch.bool, device=self.algo.device)
        else:
            h = torch.as_tensor(np.asarray(state), dtype=torch.float32, device=self.algo.device).reshape(n, -1)
            starts = torch.zeros(n, dtype=torch.bool, device=self.algo.device)
        if episode_start is not None:
            starts = torch.as_tensor(np.asarray(episode_start), device=self.algo.device).reshape(n).bool()
        action, h = self.algo.act_recurrent(x, h, starts, deterministic)
        action = action.cpu().numpy()
        return (action[0] if single else action), h.cpu().numpy()

    def export(self, path: str | Path | None = None, format: str = "onnx", **kwargs) -> dict:
        """Write the deterministic policy (normalizer and action scaling inside) as ``onnx``,
        ``torchscript`` or ``exported-program`` and check it against this policy on sample
        observations (``corral.export.export_agent``: input convention, parity check). Default
        path: ``<run_dir>/policy.<ext>``. Returns what was written and the largest difference."""
        from corral.export import export_agent

        return export_agent(self, path, format, **kwargs)

    def save(self, path: str | Path) -> Path:
        state = dict(self._state) if self._state else {"config": C.to_dict(self.cfg), "counters": {}}
        # an acting copy (``load``) holds only the networks: the rest of the training state stays as loaded
        state["algo"] = {**state.get("algo", {}), **self.algo.state_dict()}
        state["config"] = C.to_dict(self.cfg)
        return save_checkpoint(state, path)


def train(algo: str, env: Any = "CartPole-v1", steps: int | None = None, seed: int = 0,
          run_dir: str | None = None, save_run: bool = True, quiet: bool = True, tag: str | None = None,
          imports: tuple[str, ...] = (), **overrides) -> Agent:
    """Train ``algo`` on ``env`` (an id, ``module:callable``, a class or an instance).

    ``overrides`` are config keys, e.g. ``lr=1e-3`` or ``**{"env.num_envs": 4}``. ``tag``
    names the run (``log.tag``: in the run directory's name, TensorBoard and the config).
    ``imports``: modules (or ``path/file.py``) that register the run's own algorithms or envs,
    imported here and in every worker.
    """
    cfg = build_config(algo, env, steps=steps, seed=seed, overrides=overrides, tag=tag, imports=imports)
    learner = Learner(cfg, None, env_spec=env, quiet=quiet)  # built before touching the disk, as the CLI does
    path = new_run_dir(cfg, run_dir) if save_run else None
    if path:
        learner.run_dir = path
        (path / "config.yaml").write_text(C.dump_yaml(cfg))
    summary = learner.train()
    return Agent(learner.algo, cfg, path, state=learner.state_dict(), summary=summary)


# checkpoints of other kinds, by the top-level key that marks them: key -> loader(state, device)
# (corral.population.ensemble registers "ensemble"; corral imports it)
CHECKPOINT_KINDS: dict[str, Any] = {}


def build_acting_algo(cfg: C.TrainConfig, device: torch.device):
    """The algorithm of ``cfg`` built for acting only: no replay, rollout storage or optimizer state."""
    env = make_env(cfg, None, "cpu", num_envs=1, evaluation=True)
    spec = get_algo(cfg.algo)
    algo = spec.class_for(cfg.algo_cfg)(cfg.algo_cfg, env.single_observation_space, env.single_action_space, cfg.env.num_envs,
                    device, RNGStreams(cfg.seed, device), role="actor")
    env.close()
    return algo


def load(path: str | Path, device: str = "auto") -> Agent:
    """Load an agent from a checkpoint file or a run directory (best, else latest)."""
    ckpt = resolve_checkpoint(path)
    dev = resolve_device(device)
    state = load_checkpoint(ckpt, map_location=dev)
    for key, loader in CHECKPOINT_KINDS.items():  # an ensemble's checkpoint, ...
        if key in state:
            return loader(state, dev)
    cfg = config_from_dict(state["config"])
    algo = build_acting_algo(cfg, dev)
    from corral.errors import UserError

    try:
        algo.load_state_dict(state["algo"])
    except (KeyError, RuntimeError, ValueError) as e:
        raise UserError(f"checkpoint {str(ckpt)!r} does not match its config ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    return Agent(algo, cfg, run_dir, state=state)


def evaluate(agent: Agent, env: Any = None, episodes: int = 10, seed: int = 0, deterministic: bool | None = None,
             num_envs: int = 1, epsilon: float | None = None, max_episode_steps: int | None = None,
             max_seconds: float | None = None, on_episode=None) -> dict:
    """Statistics of the raw env return over ``episodes`` episodes (``corral.train.evaluate.summarize``:
    mean, std, median, min, max, 95% bootstrap interval) under the run's evaluation protocol,
    stated in ``out["protocol"]``; the keyword arguments given replace the config's ``eval.*``
    values. Epsilon draws come from the ``eval_action`` stream of ``seed``."""
    spec = env if env is not None else agent.cfg.env.id
    protocol = resolve_protocol(agent.cfg, agent.algo, spec, epsilon=epsilon, deterministic=deterministic,
                                max_episode_steps=max_episode_steps, max_seconds=max_seconds)
    cap = protocol.max_episode_steps if protocol.episode_cap == "eval.max_episode_steps" else None
    if env is None:
        venv = make_env(agent.cfg, None, agent.algo.device, num_envs=num_envs, evaluation=True,
                        max_episode_steps=cap)
    else:
        venv = make_vec_env(spec, num_envs, {}, agent.algo.device, "sync", atari_wrappers="eval",
                            max_episode_steps=cap)
    try:
        out = evaluate_policy(agent.algo.policy(protocol.deterministic), venv, episodes,
                              protocol, seed=seed, on_episode=on_episode,
                              generator=eval_generator(RNGStreams(seed).seeds["eval_action"], agent.algo.device))
    finally:
        venv.close()
    out["env"] = env_name(spec)
    return out
