"""Node loss on a simulated cluster (``ray.cluster_utils.Cluster``: several raylets on this
machine). Every node offers a custom resource and the run asks for it per part
(``scheme.collector_resources`` / ``grad_resources`` / ``replay_resources``), so where each
actor may go is explicit. Removing the node that holds a collector mid-run kills that
collector and whatever else sat there; corral restarts each of them, and Ray places the
replacements on the nodes that remain. A driver that dies is resumed from ``latest.pt``
with ``corral resume`` on the same cluster and the same placement.

One cluster per module (starting raylets is the expensive part)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from corral.errors import UserError
from corral.schemes.ray_scheme import RayScheme
from corral.train.learner import Learner
from corral.train.setup import build_config, new_run_dir

ray = pytest.importorskip("ray")

# Each worker node: 2 CPUs and 2 "slot"s; the head: 1 CPU and the "head" resource (the
# driver and the replay server). 2 collectors + 2 gradient workers ask a slot each.
PLACEMENT = {"scheme.collector_resources": {"slot": 1}, "scheme.grad_resources": {"slot": 1},
             "scheme.replay_resources": {"head": 1}}
APEX = {"scheme.collectors": 2, "scheme.grad_workers": 2, "env.num_envs": 2, "apex_dqn.learning_starts": 256,
        "apex_dqn.hidden": [16], "apex_dqn.rollout_fragment": 32, "apex_dqn.batch_size": 32,
        "apex_dqn.prefetch": 4, "apex_dqn.train_freq": 16, "apex_dqn.gradient_steps": 2,
        "checkpoint.every": 1024, "log_every": 256, "tensorboard": False, "progress": False, "eval.episodes": 0,
        **PLACEMENT}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"head": 1}, "include_dashboard": False,
        # a removed node is seen dead within a second or two (defaults: ~30 s)
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           # every object in the store of the node that made it (not inlined into its
                           # owner): a fragment the replay server has not read yet goes with its node
                           "max_direct_call_object_size": 64}})
    # Cluster writes its address where a plain ray.init() on this machine would join it: take
    # it back, so other Ray sessions here start their own (this test joins by address)
    from ray._common.utils import reset_ray_address

    reset_ray_address()
    workers = [c.add_node(num_cpus=2, resources={"slot": 2}) for _ in range(3)]
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING")
    yield c, workers
    ray.shutdown()
    c.shutdown()


def node_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)


def test_a_removed_node_has_its_collector_and_workers_restarted_on_the_remaining_nodes(cluster, tmp_path):
    """Ape-X DQN, 2 collectors + 2 gradient workers on 3 worker nodes, the replay server on the
    head. After 20 fragments the node holding collector 1 is removed: everything that sat there
    dies, is restarted on the 2 nodes left (each part counted once per death), and the run ends
    at its budget with a checkpoint."""
    c, workers = cluster
    cfg = build_config("apex_dqn", "CartPole-v1", steps=3072, seed=0, overrides=APEX)
    L = Learner(cfg, new_run_dir(cfg, str(tmp_path / "r")), env_spec="CartPole-v1", quiet=True)
    scheme = RayScheme(L)
    seen = {}

    def remove(meta, data):
        if scheme.fragments == 20 and not seen:
            nodes = {w.node_id: w for w in workers if w in c.worker_nodes}
            at = [node_of(a) for a in scheme.pool.actors] + [node_of(w) for w in scheme.grad_pool.workers]
            seen["before"], seen["removed"] = at, at[1]
            c.remove_node(nodes[at[1]])

    scheme.fragment_callback = remove
    L.make_stream = scheme.stream
    summary = L.train()
    assert summary["env_steps"] == 3072 and seen
    gone = seen["removed"]
    died = seen["before"].count(gone)  # collector 1, and any other part that shared its node
    col_died, grad_died = seen["before"][:2].count(gone), seen["before"][2:].count(gone)
    assert died == col_died + grad_died >= 1 and col_died >= 1
    assert scheme.restarts == col_died and scheme.grad_restarts == grad_died and scheme.replay_restarts == 0
    rows = [json.loads(line) for line in (L.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "collector_restarts" in r][-1]
    assert last["collector_restarts"] == col_died and last["grad_worker_restarts"] == grad_died
    assert (L.run_dir / "checkpoints" / "latest.pt").is_file()
    # the replay holds every env step but those of fragments lost with the node (sent to the
    # server, not yet read by it; at most the one consumed as the node went)
    lost = scheme.replay_lost
    assert lost % 64 == 0 and L.algo.replay.steps_added * 2 == 3072 - lost
    print(f"\nnode loss: parts on the removed node {died} (collectors {col_died}, grad workers {grad_died}), "
          f"transitions lost on the way {lost}")


def test_a_placement_no_node_offers_is_refused_with_the_resources_the_cluster_has(cluster):
    cfg = build_config("apex_dqn", "CartPole-v1", steps=512, overrides={
        **APEX, "scheme.collector_resources": {"gpu_box": 1}})
    with pytest.raises(UserError, match=r"scheme.collector_resources asks for \{'gpu_box': 1\}, but no node .* "
                                        r"offers gpu_box .*'slot'"):
        Learner(cfg, None, env_spec="CartPole-v1", quiet=True).train()
    cfg = build_config("apex_dqn", "CartPole-v1", steps=512, overrides={**APEX, "scheme.grad_resources": {"CPU": 1}})
    with pytest.raises(UserError, match=r"scheme.grad_resources has CPU: 1; give custom resource names"):
        Learner(cfg, None, env_spec="CartPole-v1", quiet=True).train()


@pytest.mark.slow  # two CLI processes joining the cluster: ~2 min here under load
def test_a_driver_killed_mid_run_is_resumed_from_latest_on_the_same_cluster_and_placement(cluster, tmp_path):
    """`corral train` joins the cluster (``scheme.ray_address``) with the placement above and is
    killed (SIGKILL: no clean shutdown) once it has written a checkpoint; `corral resume` of the
    run directory joins the same cluster from the saved config, with the same placement, and
    finishes the budget."""
    c, _ = cluster
    run = tmp_path / "run"
    over = {**APEX, "scheme.ray_address": c.address, "checkpoint.every": 512, "log_every": 128}
    sets = [arg for k, v in over.items() for arg in ("--set", f"{k}={json.dumps(v)}")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "corral.cli", "train", "apex_dqn", "CartPole-v1", "--steps", "4096",
           "--run-dir", str(run), *sets]
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    latest = run / "checkpoints" / "latest.pt"
    deadline = time.time() + 240
    while not latest.is_file() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert latest.is_file(), driver.poll() is not None and driver.stderr.read()
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    from corral.train.checkpoint import load_checkpoint

    saved = load_checkpoint(latest)
    at_kill = int(saved["counters"]["env_steps"])
    assert 0 < at_kill < 4096
    assert saved["config"]["scheme"]["collector_resources"] == {"slot": 1}
    out = subprocess.run([sys.executable, "-m", "corral.cli", "resume", str(run)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    final = load_checkpoint(latest)
    assert final["counters"]["env_steps"] == 4096
    assert final["config"]["scheme"] == saved["config"]["scheme"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("step", 0) for r in rows) >= 4096
    print(f"\ndriver killed at {at_kill} steps, resumed to 4096")


@pytest.mark.slow  # a learning run on the simulated cluster: a few minutes on an idle 2-core machine
def test_apex_dqn_that_loses_a_node_mid_run_still_learns_cartpole(cluster, tmp_path):
    """The apex_dqn CartPole preset (2 collectors x 4 envs, a slot each; the replay server on
    the head; checkpoints every 5k steps) on the cluster, three worker nodes (one is added back
    if an earlier test removed one). After 40 fragments (10,240 env steps, while it learns:
    periodic evaluations are near 150 there) the node holding collector 1 is removed; the
    run stops at its first periodic evaluation (10 episodes every 2,500 steps) of 500, and the
    policy it ends with (``latest.pt``) is evaluated held out (20 episodes, seed 123): >= 475,
    with every part that sat on the removed node restarted once and counted."""
    import corral

    c, workers = cluster
    while len(c.worker_nodes) < 3:
        workers.append(c.add_node(num_cpus=2, resources={"slot": 2}))
    c.wait_for_nodes()
    run = tmp_path / "r"
    cfg = build_config("apex_dqn", "CartPole-v1", steps=120_000, seed=0, overrides={
        "scheme.collectors": 2, **PLACEMENT, "eval.every": 2500, "eval.episodes": 10,
        "eval.stop_at_return": 500, "checkpoint.every": 5000, "tensorboard": False, "progress": False})
    L = Learner(cfg, new_run_dir(cfg, str(run)), env_spec="CartPole-v1", quiet=True)
    scheme = RayScheme(L)
    seen = {}

    def remove(meta, data):
        if scheme.fragments == 40 and not seen:
            nodes = {w.node_id: w for w in c.worker_nodes}
            at = [node_of(a) for a in scheme.pool.actors]
            seen["before"], seen["removed"], seen["step"] = at, at[1], L.env_steps
            c.remove_node(nodes[at[1]])

    scheme.fragment_callback = remove
    L.make_stream = scheme.stream
    summary = L.train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_return"]) for r in rows if "eval_return" in r]
    held = corral.evaluate(corral.load(run / "checkpoints" / "latest.pt"), "CartPole-v1", episodes=20,
                           seed=123)["mean_return"]
    died = seen["before"].count(seen["removed"])
    print(f"\nnode loss, learning: node removed at {seen['step']} steps with {died} collector(s); restarts "
          f"{scheme.restarts}, transitions lost {scheme.replay_lost}; stopped at {summary['env_steps']} steps; "
          f"held out (latest.pt) {held:.1f}; evals {evals}")
    assert seen and scheme.restarts == died >= 1 and scheme.replay_restarts == 0
    assert [r for r in rows if "collector_restarts" in r][-1]["collector_restarts"] == died
    assert summary["env_steps"] > seen["step"]
    assert held >= 475, (held, evals)
