"""MAPPO on MPE simple_spread (3 agents, discrete actions): corral vs TorchRL, side by side.

Both at MAPPO's MPE settings (corral's preset): 8 envs stepped in this process, 100 steps per
env per update (800 env steps), one minibatch, 10 epochs, Adam lr 7e-4, clip 0.2, entropy
0.01, gamma 0.99, GAE lambda 0.95, gradient norm clip 10, 64x64 tanh MLPs, one policy and one
centralised value shared by the agents. What differs, each library's own way: corral's value
sees MPE's global state plus a one-hot agent id and predicts ValueNorm-normalised values;
TorchRL's (``MultiAgentMLP(centralised=True, share_params=True)``) sees all agents'
observations concatenated, no value normalisation. One torch thread each; the runners
alternate per seed in one process, so both see the same machine load.

Reported per run: env steps per second over the whole training (collection and updates,
construction excluded), and the team return (sum over steps of the agents' mean reward) of
the final policy, greedy, over 20 held-out episodes (seeds 10_000 + i), evaluated the same way
for both. A random team's return on this metric: ``--random``.

    pip install 'torchrl>=0.14,<0.15'
    python benchmarks/bench_mappo.py --steps 40000 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

ENV_KW = {"max_cycles": 25, "continuous_actions": False}
N_ENVS, N_STEPS, EPOCHS, LR, HIDDEN = 8, 100, 10, 7e-4, 64


def team_return(act, episodes: int = 20) -> float:
    """Mean team return of ``act({agent: obs}) -> {agent: int}`` on fresh simple_spread envs."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**ENV_KW)
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 + i)
        total = 0.0
        while env.agents:
            obs, rew, _, _, _ = env.step(act(obs))
            total += float(np.mean(list(rew.values())))
        out.append(total)
    return float(np.mean(out))


def run_corral(steps: int, seed: int) -> dict:
    from corral.agent import Agent
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    cfg = build_config("mappo", "mpe:simple_spread_v3", steps=steps, seed=seed, sets=[
        "progress=false", "eval.episodes=0", "tensorboard=false", f"env.num_envs={N_ENVS}",
        f"mappo.n_steps={N_STEPS}", f"mappo.n_epochs={EPOCHS}", "mappo.batch_size=0", f"mappo.lr={LR}",
        f"mappo.hidden=[{HIDDEN}, {HIDDEN}]"])
    L = Learner(cfg, None)
    t0 = time.perf_counter()
    L.train()
    seconds = time.perf_counter() - t0
    agent = Agent(L.algo, L.cfg)
    return {"sps": L.env_steps / seconds, "steps": L.env_steps, "return": team_return(agent.act)}


def run_torchrl(steps: int, seed: int) -> dict:
    from mpe2 import simple_spread_v3
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs import SerialEnv
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor
    from torchrl.objectives import ClipPPOLoss, ValueEstimators

    torch.manual_seed(seed)

    def make():
        return PettingZooWrapper(simple_spread_v3.parallel_env(**ENV_KW), categorical_actions=True,
                                 seed=seed)

    env = SerialEnv(N_ENVS, make)
    env.set_seed(seed)
    group = "agent"
    obs_dim = env.observation_spec[group, "observation"].shape[-1]
    n_agents = env.observation_spec[group, "observation"].shape[-2]
    n_actions = env.full_action_spec[group, "action"].space.n
    policy_net = MultiAgentMLP(obs_dim, n_actions, n_agents, centralised=False, share_params=True, depth=2,
                               num_cells=HIDDEN, activation_class=nn.Tanh)
    policy = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=[(group, "observation")], out_keys=[(group, "logits")]),
        in_keys=[(group, "logits")], out_keys=[(group, "action")], distribution_class=torch.distributions.Categorical,
        return_log_prob=True, log_prob_key=(group, "sample_log_prob"))
    critic_net = MultiAgentMLP(obs_dim, 1, n_agents, centralised=True, share_params=True, depth=2, num_cells=HIDDEN,
                               activation_class=nn.Tanh)
    critic = TensorDictModule(critic_net, in_keys=[(group, "observation")], out_keys=[(group, "state_value")])
    loss = ClipPPOLoss(policy, critic, clip_epsilon=0.2, entropy_coeff=0.01, normalize_advantage=True)
    loss.set_keys(reward=(group, "reward"), action=(group, "action"), sample_log_prob=(group, "sample_log_prob"),
                  value=(group, "state_value"), done=(group, "done"), terminated=(group, "terminated"))
    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)
    opt = torch.optim.Adam(loss.parameters(), LR)
    collector = Collector(env, policy, frames_per_batch=N_ENVS * N_STEPS, total_frames=steps)
    t0 = time.perf_counter()
    frames = 0
    for data in collector:
        frames += data.numel()
        with torch.no_grad():
            loss.value_estimator(data, params=loss.critic_network_params,
                                 target_params=loss.target_critic_network_params)
        flat = data.reshape(-1)
        for _ in range(EPOCHS):
            out = loss(flat)
            total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
            opt.zero_grad()
            total.backward()
            torch.nn.utils.clip_grad_norm_(loss.parameters(), 10.0)
            opt.step()
        collector.update_policy_weights_()
    seconds = time.perf_counter() - t0
    collector.shutdown()
    agents = [f"agent_{i}" for i in range(n_agents)]

    @torch.no_grad()
    def act(obs):
        x = torch.as_tensor(np.stack([obs[a] for a in agents]), dtype=torch.float32)
        return {a: int(u) for a, u in zip(agents, policy_net(x).argmax(-1))}

    return {"sps": frames / seconds, "steps": frames, "return": team_return(act)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--random", action="store_true", help="also the random team's return on the same episodes")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = {"corral": [], "torchrl": []}
    for seed in args.seeds:
        for name, fn in (("corral", run_corral), ("torchrl", run_torchrl)):
            r = fn(args.steps, seed)
            rows[name].append(r)
            print(json.dumps({"runner": name, "seed": seed, **r}), flush=True)
    if args.random:
        rng = np.random.default_rng(0)
        print(json.dumps({"runner": "random", "return": team_return(lambda o: {a: int(rng.integers(5)) for a in o})}))
    sps = {k: statistics.median(r["sps"] for r in v) for k, v in rows.items()}
    print(json.dumps({"median_sps": sps, "ratio_corral_over_torchrl": sps["corral"] / sps["torchrl"],
                      "returns": {k: [round(r["return"], 2) for r in v] for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
