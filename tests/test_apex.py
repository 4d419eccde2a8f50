"""Ape-X: the exploration ladders, collector priorities that use the replay's own n-step
targets, the replay server and the learner's pipelined client, the BipedalWalkerHardcore
preset, and Ape-X DQN solving CartPole with two Ray collectors."""

import dataclasses
import json

import pytest
import torch

import corral
from corral.algos.apex import ApexTD3, ladder, nstep_window
from corral.cli import main
from corral.schemes.collector import Collector, driver_paths
from corral.schemes.fragments import FragmentScheme
from corral.schemes.replay_server import ReplayClient, ReplayServer
from corral.storage.replay import ReplayBuffer
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def collector(algo, env, index=0, workers=1, **overrides):
    cfg = build_config(algo, env, overrides={**QUIET, **overrides})
    return Collector(cfg, env, index, workers, paths=driver_paths())


def test_epsilon_ladder_is_the_papers_over_every_env_of_every_collector():
    eps = torch.cat([collector("apex_dqn", "CartPole-v1", k, 3, **{"env.num_envs": 2}).algo.epsilon
                     for k in range(3)])
    i = torch.arange(6, dtype=torch.float64)
    torch.testing.assert_close(eps, (0.4 ** (1 + 7 * i / 5)).float())


def test_noise_ladder_runs_geometrically_from_noise_max_to_noise_min():
    torch.testing.assert_close(ladder(0.5, 0.05, 3, "cpu"), torch.tensor([0.5, 0.5 * 0.1 ** 0.5, 0.05]))
    c = collector("apex_ddpg", "Pendulum-v1", 1, 2, **{"env.num_envs": 2})
    torch.testing.assert_close(c.algo.env_ladder(0.5, 0.05), ladder(0.5, 0.05, 4, "cpu")[2:])


@pytest.mark.parametrize("n_step", [1, 3])
def test_collector_priority_targets_are_the_replay_buffers_targets(n_step):
    c = collector("apex_dqn", "CartPole-v1", **{"env.num_envs": 3, "apex_dqn.n_step": n_step,
                                               "apex_dqn.rollout_fragment": 50, "apex_dqn.learning_starts": 0})
    _, data = c.collect(None, 0)
    assert (data.terminated | data.truncated).any()
    ret, next_obs, discount = nstep_window(data, 0.99, n_step)
    server = ReplayServer(c.algo.cfg, 3, c.algo.obs_space, c.algo.act_space, seed=0)
    server.buffer = ReplayBuffer(1000, 3, c.algo.obs_space, c.algo.act_space, n_step=n_step, gamma=0.99)
    server.add(data)
    batch = server.buffer.sample(4000)
    t, e = batch.indices // 3, batch.indices % 3
    torch.testing.assert_close(batch.reward, ret[t, e])
    torch.testing.assert_close(batch.discount, discount[t, e])
    torch.testing.assert_close(batch.next_obs, next_obs[t, e])
    # the priority of each transition: |Q(s, a) - (n-step return + discount * max_a' Q(s', a'))|
    # with the collector's own (online) network, which is what Ape-X collectors hold
    with torch.no_grad():
        q = c.algo.actor.q(batch.obs).gather(-1, batch.action.unsqueeze(-1)).squeeze(-1)
        target = batch.reward + batch.discount * c.algo.actor.q(batch.next_obs).amax(-1)
    assert data.priorities.shape == (50, 3)
    torch.testing.assert_close(data.priorities[t, e], (q - target).abs(), rtol=1e-5, atol=1e-6)
    assert data.priorities.std() > 0


def test_apex_ddpg_scores_transitions_with_the_broadcast_critic():
    c = collector("apex_ddpg", "Pendulum-v1", **{"env.num_envs": 2, "apex_ddpg.learning_starts": 0})
    learner_algo = ApexTD3(c.algo.cfg, c.algo.obs_space, c.algo.act_space, 2, torch.device("cpu"), c.rng)
    with torch.no_grad():
        for p in learner_algo.critics.parameters():
            p.add_(0.3)
    from corral.schemes.collector import collector_state

    _, data = c.collect(collector_state(learner_algo), 1)
    for k, v in learner_algo.critics.state_dict().items():
        assert torch.equal(c.algo.critics.state_dict()[k], v), k
    assert data.priorities.shape == (64, 2)
    # by hand with the learner's networks (the shifted critics): the largest |TD| over the
    # critics, targets from the min over them at mu(s'), as the learner's PER priorities
    ret, next_obs, discount = nstep_window(data, c.algo.cfg.gamma, c.algo.cfg.n_step)
    a = learner_algo
    with torch.no_grad():
        enc = a.actor.enc
        o, no = enc(data.obs[:-1].flatten(0, 1)), enc(next_obs.flatten(0, 1))
        q = a.critics(o, a.actor.box.to_unit(data.extras.action.flatten(0, 1)))  # [critics, B]
        target = ret.flatten() + discount.flatten() * a.critics(no, a.actor(no)).min(0).values
        expected = (q - target).abs().max(0).values.view(64, 2)
    torch.testing.assert_close(data.priorities, expected, rtol=1e-5, atol=1e-6)


def test_replay_client_draws_a_group_ahead_and_sends_back_every_priority():
    c = collector("apex_dqn", "CartPole-v1", **{"env.num_envs": 4, "apex_dqn.rollout_fragment": 256,
                                               "apex_dqn.learning_starts": 0})
    _, data = c.collect(None, 0)
    cfg = dataclasses.replace(c.algo.cfg, buffer_size=10_000)  # a collector's own replay is the smallest there is
    server = ReplayServer(cfg, 4, c.algo.obs_space, c.algo.act_space, seed=0)
    calls = []

    def call(name, *args):
        calls.append((name, args))
        return getattr(server, name)(*args)

    client = ReplayClient(call, lambda result: result, "cpu", capacity=10_000, prefetch=4)
    client.add(data, 256, 4)
    sent = []
    for _ in range(8):  # two groups of four batches
        batch = client.sample(32)
        assert batch.obs.shape == (32, 4)
        # a batch spans the whole sum tree, not one slice of a stratified draw
        assert int(batch.indices.max() - batch.indices.min()) > 1024 // 2
        client.update_priorities(batch.indices, torch.full((32,), 0.5))
        sent.append(batch.indices)
    exchanges = [args for name, args in calls if name == "exchange"]
    # one request per group and the next one always in flight: the second group was drawn
    # before any priority came back, the third carries the first group's
    assert len(exchanges) == 3
    assert exchanges[0][0] is None and exchanges[1][0] is None
    assert torch.equal(exchanges[2][0], torch.cat(sent[:4]))
    client.state_dict()  # what is still held goes out before the server's state is read
    assert calls[-2][0] == "update_priorities" and torch.equal(calls[-2][1][0], torch.cat(sent[4:]))
    touched = torch.cat(sent).unique()
    torch.testing.assert_close(server.buffer.priorities[touched],
                               torch.full((touched.numel(),), (0.5 + 1e-6) ** 0.6, dtype=torch.float64))


def test_apex_dqn_runs_in_process_through_the_cli(tmp_path, capsys):
    assert main(["train", "apex_dqn", "CartPole-v1", "--steps", "2000", "--run-dir", str(tmp_path / "r"), "--json",
                 "--set", "tensorboard=false", "--set", "eval.episodes=1", "--set", "learning_starts=500"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env_steps"] == 2000


def test_replay_server_loop_keeps_every_transition_and_the_in_process_replay_ratio():
    over = {**QUIET, "learning_starts": 512, "train_freq": 16, "gradient_steps": 2, "hidden": [16]}
    local = Learner(build_config("apex_dqn", "CartPole-v1", steps=4096, overrides=over), None, quiet=True)
    local.train()
    L = Learner(build_config("apex_dqn", "CartPole-v1", steps=4096, overrides={**over, "scheme.collectors": 2}),
                None, quiet=True)
    scheme = FragmentScheme(L)  # the replay server in this process
    L.make_stream = scheme.stream
    L.train()
    assert L.env_steps == 4096 and len(L.algo.replay) == 4096  # back in the learner after the run
    assert L.algo.grad_steps == local.algo.grad_steps == 2 * (1024 // 16 - 127 // 16)


def test_bipedal_walker_hardcore_preset_is_the_issues_setting():
    cfg = build_config("apex_ddpg", "BipedalWalkerHardcore-v3")
    a = cfg.algo_cfg
    assert (cfg.scheme.collectors, cfg.env.num_envs, cfg.scheme.collect) == (30, 30, "async")
    assert a.hidden == (200, 200) and a.activation == "relu" and a.lr == 1e-4 and a.tau == 0.005
    assert (a.target_noise, a.target_noise_clip, a.batch_size, a.buffer_size) == (0.3, 0.5, 128, 500_000)
    assert (a.rollout_fragment, a.n_step, a.normalize_obs, a.n_critics) == (64, 1, True, 1)


def test_apex_ddpg_runs_scaled_down_on_bipedal_walker_hardcore(ray_local, tmp_path):
    pytest.importorskip("Box2D")
    agent = corral.train("apex_ddpg", "BipedalWalkerHardcore-v3", steps=2048, seed=0, run_dir=str(tmp_path / "r"),
                         **{"scheme.collectors": 2, "env.num_envs": 2, "buffer_size": 10_000, "learning_starts": 512,
                            "hidden": [32, 32], "rollout_fragment": 32, "eval.episodes": 0, "tensorboard": False})
    assert agent.summary["env_steps"] == 2048
    state = torch.load(tmp_path / "r" / "checkpoints" / "latest.pt", weights_only=True)
    assert state["algo"]["replay"]["steps"] * 2 == 2048  # the replay server's content is in the checkpoint
    assert state["algo"]["actor"]["enc.norm.count"] == 2048  # normalizer statistics from both collectors


def test_apex_dqn_with_two_ray_collectors_learns_cartpole(ray_local, tmp_path):
    # The apex_dqn CartPole preset: 2 collectors x 4 envs, a replay server, batches drawn 16
    # per request. Measured on the 2-core machine, 8 Ray runs of 80k steps (seeds 0-7): all
    # reached 500, first at 17.5-52.5k steps; about one run in eight lingers near 120-150 first
    # (also with in-process collectors, so it is the algorithm on CartPole, not Ray's timing),
    # hence a budget of 120k. Robust by design: the run stops at the first periodic
    # deterministic evaluation (10 episodes every 2,500 steps) of 500, the best evaluation's
    # checkpoint is picked, and the assertion is a held-out evaluation on other seeds
    # (20 episodes) with a margin: >= 450 (random play: ~22).
    summary = corral.train("apex_dqn", "CartPole-v1", steps=120_000, seed=0, run_dir=str(tmp_path / "r"),
                           **{"scheme.collectors": 2, "eval.every": 2500, "eval.episodes": 10,
                              "eval.stop_at_return": 500, "tensorboard": False}).summary
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    evals = [(m["step"], m["eval_return"]) for m in map(json.loads, lines) if "eval_return" in m]
    best = corral.load(tmp_path / "r")  # checkpoints/best.pt
    held_out = corral.evaluate(best, "CartPole-v1", episodes=20, seed=123)["mean_return"]
    print(f"\napex-dqn-ray: steps={summary['env_steps']} stopped={summary['stopped_early']} "
          f"best_eval={max(e for _, e in evals):.1f} held_out={held_out:.1f} evals={evals}")
    assert max(e for _, e in evals) >= 475, evals
    assert held_out >= 450, (held_out, evals)


@pytest.mark.slow
def test_apex_ddpg_with_two_ray_collectors_learns_pendulum(ray_local, tmp_path):
    # The apex_ddpg Pendulum preset (20k steps, 2 collectors x 2 envs). Measured here: eval
    # -136 with Ray in 150 s, -134 in-process in 52 s (random play: about -1200). Robust by
    # design: periodic deterministic evaluations (10 episodes every 2k steps) over the whole
    # budget, the best one's checkpoint, and a held-out evaluation on other seeds (20 episodes)
    # with a margin. No early stop: the periodic evaluations replay the same initial states, and
    # a stop at -150 on them picked policies that scored -390 (5 episodes) and -323 (10) held out.
    agent = corral.train("apex_ddpg", "Pendulum-v1", seed=0, run_dir=str(tmp_path / "r"),
                         **{"scheme.collectors": 2, "eval.every": 2000, "eval.episodes": 10, "tensorboard": False})
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    evals = [(m["step"], round(m["eval_return"], 1)) for m in map(json.loads, lines) if "eval_return" in m]
    best = corral.load(tmp_path / "r")
    held_out = corral.evaluate(best, "Pendulum-v1", episodes=20, seed=123)["mean_return"]
    print(f"\napex-ddpg-ray: steps={agent.summary['env_steps']} held_out={held_out:.1f} evals={evals}")
    assert held_out >= -400, (held_out, evals)
