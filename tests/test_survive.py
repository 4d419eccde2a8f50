"""Distributed runs that survive their parts dying: gradient workers (sync and async) and the
replay server killed mid-run with ``ray.kill`` are restarted, the update in flight redone,
the replay restored from the last checkpoint with its loss counted; a part that keeps dying
ends the run with one message and its last checkpoint. (Collectors: tests/test_schemes.py.)

The kills go through one helper, ``conftest.ray_scheme_killing``. Learning-sized runs are slow.
"""

import json

import pytest
import torch
from conftest import ray_scheme_killing

import corral
from corral.errors import TrainingError, UserError
from corral.schemes.fragments import FragmentScheme
from corral.train.checkpoint import load_checkpoint
from corral.train.learner import Learner
from corral.train.setup import build_config, new_run_dir

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


def learner(algo, env, steps, run_dir=None, seed=0, **overrides):
    cfg = build_config(algo, env, steps=steps, seed=seed, overrides={**QUIET, **overrides})
    return Learner(cfg, new_run_dir(cfg, str(run_dir)) if run_dir else None, env_spec=env, quiet=True)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def last(rows: list[dict], key: str) -> float:
    """The last logged value of ``key`` (evaluation rows carry no scheme metrics)."""
    return [r[key] for r in rows if key in r][-1]


def flat(algo) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in algo.synced_tensors()])


# ---------------------------------------------------------------------------
# gradient workers

DQN_GRAD = {"scheme.grad_workers": 2, "dqn.learning_starts": 100, "dqn.batch_size": 32, "dqn.hidden": [16],
            "dqn.train_freq": 4, "dqn.gradient_steps": 1, "log_every": 64}


def test_a_sync_gradient_worker_killed_mid_step_is_replaced_and_the_run_equals_one_without_a_death(
        ray_local, tmp_path):
    """Worker 1 dies between a step's ``begin`` and its ``resume`` (the step in flight): its
    replacement loads the batch, replays ``begin`` and takes the ``resume``. Every parameter
    ends bit for bit where the same sharded run with in-process workers (no death) ends."""
    L = learner("dqn", "CartPole-v1", 400, tmp_path / "killed", **DQN_GRAD)
    scheme, killed = ray_scheme_killing(L, ray_local, "grad", after=20)  # update 10's resume
    assert L.train()["env_steps"] == 400
    ref = learner("dqn", "CartPole-v1", 400, None, **DQN_GRAD)
    ref.make_stream = FragmentScheme(ref).stream  # in-process gradient workers, the same sharding
    ref.train()
    assert killed and scheme.grad_restarts == 1
    assert L.algo.grad_steps == ref.algo.grad_steps == 76
    assert torch.equal(flat(L.algo), flat(ref.algo))
    assert last(metrics(L.run_dir), "grad_worker_restarts") == 1


def test_an_async_gradient_worker_killed_mid_run_has_its_step_redone(ray_local, tmp_path):
    """PPO with async gradient workers: the minibatch in flight on the dead worker is handed,
    with the parameters it was sent, to the replacement; every minibatch is applied."""
    over = {"scheme.grad_workers": 2, "scheme.grad": "async", "ppo.n_steps": 128, "ppo.batch_size": 64,
            "ppo.n_epochs": 2, "env.num_envs": 4, "log_every": 512}
    L = learner("ppo", "CartPole-v1", 2048, tmp_path / "r", **over)
    scheme, killed = ray_scheme_killing(L, ray_local, "grad", after=9)
    assert L.train()["env_steps"] == 2048
    assert killed and scheme.grad_restarts == 1
    assert last(metrics(L.run_dir), "grad_worker_restarts") == 1
    # 4 updates x 2 epochs x 8 minibatches, every one applied (the lost one redone, once)
    assert L.algo.optimizer.steps == 64


# ---------------------------------------------------------------------------
# the replay server

APEX = {"scheme.collectors": 2, "env.num_envs": 2, "apex_dqn.learning_starts": 256, "apex_dqn.hidden": [16],
        "apex_dqn.rollout_fragment": 32, "apex_dqn.batch_size": 32, "apex_dqn.prefetch": 4,
        "apex_dqn.train_freq": 16, "apex_dqn.gradient_steps": 2,
        "checkpoint.every": 1024, "log_every": 256}


def test_a_killed_replay_server_restarts_from_the_last_checkpoint_and_counts_what_it_lost(ray_local, tmp_path):
    """The server dies after 40 fragments (2,560 steps; the last checkpoint at or just past
    2,048): the new one holds the checkpoint's replay plus everything sent after the restart,
    and exactly the transitions sent in between are reported lost (the final replay holds
    env steps minus the loss)."""
    L = learner("apex_dqn", "CartPole-v1", 4096, tmp_path / "r", **APEX)
    scheme, killed = ray_scheme_killing(L, ray_local, "replay", after=40)
    summary = L.train()
    assert killed and summary["env_steps"] == 4096
    assert scheme.replay_restarts == 1
    lost = scheme.replay_lost
    # what was sent after the last checkpoint (written at the first update boundary past 2,048)
    # and before the death was seen (collectors pause after a few updates owed): under 1,024
    assert 0 < lost < 1024, lost
    replay = L.algo.replay  # back in the learner at the end: what the new server held
    assert replay.steps_added * 2 == 4096 - lost
    rows = metrics(L.run_dir)
    assert last(rows, "replay_restarts") == 1 and last(rows, "replay_lost_transitions") == lost
    state = load_checkpoint(L.run_dir / "checkpoints" / "latest.pt")
    assert state["counters"]["env_steps"] == 4096 and state["algo"]["replay"]["steps"] * 2 == 4096 - lost


def test_a_replay_server_killed_before_the_first_checkpoint_restarts_empty_and_the_run_goes_on(ray_local, tmp_path):
    """No checkpoint yet: the new server starts empty, so the update that saw the death cannot
    draw; it is given up (counted), no update is owed while the server refills (as in-process,
    where an update needs a batch), and training resumes from what the collectors send next."""
    L = learner("apex_dqn", "CartPole-v1", 4096, tmp_path / "r", **{**APEX, "checkpoint.every": 0})
    scheme, killed = ray_scheme_killing(L, ray_local, "replay", after=30)
    steps_before = L.algo.grad_steps
    assert L.train()["env_steps"] == 4096 and killed
    assert scheme.replay_restarts == 1 and scheme.replay_lost_updates == 1
    lost = scheme.replay_lost
    assert lost >= 30 * 64 and L.algo.replay.steps_added * 2 == 4096 - lost
    assert L.algo.grad_steps > steps_before
    rows = metrics(L.run_dir)
    assert last(rows, "replay_lost_updates") == 1 and last(rows, "replay_lost_transitions") == lost


@pytest.mark.parametrize("part", ["replay", "grad"])
def test_a_part_that_keeps_dying_ends_the_run_with_its_last_checkpoint_and_one_message(ray_local, tmp_path, part):
    over = {**APEX, "scheme.max_replay_restarts": 1, "scheme.max_grad_restarts": 1}
    if part == "grad":
        over.update({"scheme.collectors": 1, "scheme.grad_workers": 2})
    L = learner("apex_dqn", "CartPole-v1", 4096, tmp_path / "r", **over)
    ray_scheme_killing(L, ray_local, part, after=24 if part == "replay" else 100, times=2)
    name = "the replay server" if part == "replay" else "gradient worker 1"
    limit = "max_replay_restarts" if part == "replay" else "max_grad_restarts"
    with pytest.raises(TrainingError, match=rf"{name} died .* restarted 1 times \(scheme.{limit}=1\).*"
                                           r"last error: \w+"):
        L.train()
    state = load_checkpoint(L.run_dir / "checkpoints" / "latest.pt")  # the last periodic one stays
    assert 1024 <= state["counters"]["env_steps"] < 4096


def test_a_fragment_lost_on_its_way_to_the_replay_server_is_counted_and_a_death_seen_on_an_add_revives():
    """The client reads its adds' results once they have run: an add whose fragment never
    reached the server (the node holding it went away; Ray's ObjectLostError) is taken off
    ``sent``, counted and reported; an add that shows the server died goes to ``revive``."""
    from corral.schemes.replay_server import ReplayClient

    class Lost(Exception):
        pass

    class Died(Exception):
        pass

    class Handle:
        def __init__(self, value=None, error=None):
            self.value, self.error = value, error

    added = []

    def call(name, *args):
        if name == "add":
            data = args[0]
            if data in ("lost", "died"):
                return Handle(error=Lost() if data == "lost" else Died())
            added.append(data)
            return Handle(len(added))
        return Handle({"server": {}} if name == "state_dict" else 0)

    def get(h):
        if h.error is not None:
            raise h.error
        return h.value

    client = ReplayClient(call, get, "cpu", capacity=1000)
    drops, deaths = [], []
    client.done = lambda handles: handles[:-1]  # the newest add has not run yet
    client.lost = lambda e: isinstance(e, Lost)
    client.on_drop = drops.append
    client.revive = deaths.append
    for data in ("a", "lost", "b", "c"):
        client.add(data, rows=8, num_envs=2)
    client._confirm()
    assert drops == [16] and client.dropped == 16 and client.sent == 48 and len(client._adds) == 1
    state = client.state_dict()  # reads every add first: what it records as sent is what the server holds
    assert state["server"]["client"]["sent"] == 48 == 16 * len(added) and not client._adds
    client.add("died", rows=8, num_envs=2)
    client.add("d", rows=8, num_envs=2)
    client._confirm(block=True)
    assert len(deaths) == 1 and isinstance(deaths[0], Died) and client.dropped == 16


# ---------------------------------------------------------------------------
# memory: a replay that will not fit is refused before anything starts


def test_a_replay_server_that_will_not_fit_in_memory_is_refused_before_any_worker_starts(monkeypatch):
    """The learner's replay is checked where it is built, before the scheme starts Ray, the
    collectors or the server; the message gives the bytes needed, the bytes free and a size that fits."""
    import corral.schemes.ray_scheme as rs

    started = []
    monkeypatch.setattr(rs.RayScheme, "start", lambda self: started.append(self))
    cfg = build_config("apex_dqn", "CartPole-v1", steps=1000, overrides={
        **QUIET, "scheme.collectors": 2, "apex_dqn.buffer_size": 10**12})
    with pytest.raises(UserError, match=r"buffer_size=1000000000000\) needs \d+ bytes .* but only \d+ bytes "
                                          r".* are free\. Pass a smaller buffer_size \(about \d+ transitions fit"):
        Learner(cfg, None, env_spec="CartPole-v1", quiet=True).train()
    assert not started


# ---------------------------------------------------------------------------
# restore: a distributed checkpoint holds every tensor the learner's algorithm holds


def tensors_of(obj, prefix: str = "", depth: int = 0, seen=None) -> dict:
    """Every tensor reachable from ``obj`` (modules' parameters and buffers, attributes,
    lists and dicts), by path; numpy views and caches are left out, and so is a restored
    replay's ``server_generator`` (the saved sampling stream held until its replay server
    starts, then handed over and dropped: a hand-off, not state)."""
    seen = set() if seen is None else seen
    out: dict = {}
    if id(obj) in seen or depth > 5:
        return out
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, torch.nn.Module):
        for name, t in list(obj.named_parameters()) + list(obj.named_buffers()):
            out[f"{prefix}.{name}"] = t
        return out
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("corral"):
        items = ((k, v) for k, v in vars(obj).items() if k not in ("_np", "_young_cache", "env", "rng", "pool", "server_generator"))
    else:
        return out
    for k, v in items:
        out.update(tensors_of(v, f"{prefix}.{k}", depth + 1, seen))
    return out


def test_an_apex_dqn_checkpoint_restores_every_tensor_and_evaluates_as_at_save_time(ray_local, tmp_path):
    """Ape-X DQN with 2 Ray collectors, a final evaluation, then the checkpoint loaded into a
    fresh learner: every tensor the trained algorithm holds (networks, target networks, the
    normalizer, optimizer moments and step counts, the replay's rows, sum tree and max
    priority, its sampling stream) comes back equal, and the evaluation under the run's
    protocol and seeds gives exactly the saved one."""
    from corral.agent import config_from_dict

    over = {**APEX, "eval.episodes": 5, "apex_dqn.normalize_obs": True, "checkpoint.every": 0}
    L = learner("apex_dqn", "CartPole-v1", 2048, tmp_path / "r", **over)
    L.train()
    saved_eval = json.loads((L.run_dir / "eval.json").read_text())
    state = load_checkpoint(L.run_dir / "checkpoints" / "latest.pt")
    R = Learner(config_from_dict(state["config"]), None, env_spec="CartPole-v1", quiet=True)
    R.load_state_dict(state)
    live, back = tensors_of(L.algo), tensors_of(R.algo)
    assert len(live) > 20 and set(live) == set(back)
    # not state: an optimizer's gradient buffer (zeroed or overwritten before each step; its
    # per-parameter views too) and its step tensor (refilled from the saved step count before each use)
    derived = (".grad", "._step_t")
    differ = [k for k in live if not (k.endswith(derived) or ".grad_views." in k)
              and not torch.equal(live[k].cpu(), back[k].cpu())]
    assert not differ, differ
    assert any("exp_avg_sq" in k for k in live) and any("target" in k for k in live)
    assert any("norm" in k for k in live) and any("tree" in k or "sum" in k for k in live)
    again = R.evaluate()
    for key in ("mean_return", "std_return", "min_return", "max_return"):
        assert again[key] == saved_eval[key], (key, again, saved_eval)


# ---------------------------------------------------------------------------
# slow: learning through deaths, and restore without collapse


def held_out(run_dir, env="CartPole-v1") -> float:
    return corral.evaluate(corral.load(run_dir), env, episodes=20, seed=123)["mean_return"]


@pytest.mark.slow
@pytest.mark.parametrize("part", ["replay", "collector"])
def test_apex_dqn_with_a_part_killed_mid_run_still_learns_cartpole(ray_local, tmp_path, part):
    """The apex_dqn CartPole preset with 2 Ray collectors (tests/test_apex.py's learning test),
    the replay server or collector 1 killed after 60 fragments (about 30k steps, while it
    learns); checkpoints every 5k steps, so the server restarts from at most 5k steps ago.
    Judged as the undisturbed test: the best periodic evaluation >= 475, held out >= 450."""
    run = tmp_path / "r"
    cfg = build_config("apex_dqn", "CartPole-v1", steps=120_000, seed=0, overrides={
        "scheme.collectors": 2, "eval.every": 2500, "eval.episodes": 10, "eval.stop_at_return": 500,
        "checkpoint.every": 5000, "tensorboard": False, "progress": False})
    L = Learner(cfg, new_run_dir(cfg, str(run)), quiet=True)
    scheme, killed = ray_scheme_killing(L, ray_local, part, after=60)
    summary = L.train()
    rows = metrics(run)
    evals = [(m["step"], m["eval_return"]) for m in rows if "eval_return" in m]
    score = held_out(run)
    restarts = scheme.replay_restarts if part == "replay" else scheme.restarts
    print(f"\napex-dqn kill {part}: steps={summary['env_steps']} restarts={restarts} lost={scheme.replay_lost} "
          f"held_out={score:.1f} evals={evals}")
    assert killed and restarts == 1
    assert last(rows, "replay_restarts" if part == "replay" else "collector_restarts") == 1
    assert max(e for _, e in evals) >= 475, evals
    assert score >= 450, (score, evals)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ppo_with_a_gradient_worker_killed_mid_run_still_learns_cartpole(ray_local, tmp_path, mode):
    """PPO's CartPole preset with 2 Ray gradient workers; worker 1 killed at its 200th call.
    Stops at the first periodic evaluation of 500; best >= 475 and held out >= 450."""
    run = tmp_path / "r"
    cfg = build_config("ppo", "CartPole-v1", steps=150_000, seed=0, overrides={
        "scheme.grad_workers": 2, "scheme.grad": mode, "eval.every": 5000, "eval.episodes": 10,
        "eval.stop_at_return": 500, "tensorboard": False, "progress": False})
    L = Learner(cfg, new_run_dir(cfg, str(run)), quiet=True)
    scheme, killed = ray_scheme_killing(L, ray_local, "grad", after=200)
    L.train()
    rows = metrics(run)
    evals = [(m["step"], m["eval_return"]) for m in rows if "eval_return" in m]
    score = held_out(run)
    print(f"\nppo grad={mode} kill: restarts={scheme.grad_restarts} held_out={score:.1f} evals={evals}")
    assert killed and scheme.grad_restarts == 1 and last(rows, "grad_worker_restarts") == 1
    assert max(e for _, e in evals) >= 475, evals
    assert score >= 450, (score, evals)


RESTORE = {
    # algo, env, the training budget, overrides, the least save-time evaluation of every seed,
    # and what `corral resume` is given besides the 5k more steps
    "apex_dqn": ("apex_dqn", "CartPole-v1", 80_000,
                 # the preset's budget (all 8 Ray runs of tests/test_apex.py reached an eval of 500 by
                 # 52.5k): each seed stops at its first periodic evaluation of 500 and is saved there
                 {"eval.every": 2500, "eval.stop_at_return": 500}, 475.0,
                 ["--set", "eval.stop_at_return=null"]),
    "apex_ddpg": ("apex_ddpg", "Pendulum-v1", 20_000, {}, -200.0, []),  # issue 19: trained to >= -200
}


def _fresh_process_eval(run) -> dict:
    """The run's evaluation (its protocol and seeds) of ``latest.pt``, in a new Python process."""
    import subprocess
    import sys

    code = ("import json, sys\n"
            "from corral.agent import config_from_dict\n"
            "from corral.train.checkpoint import load_checkpoint\n"
            "from corral.train.learner import Learner\n"
            "state = load_checkpoint(sys.argv[1])\n"
            "cfg = config_from_dict(state['config']); cfg.scheme.collectors = 1\n"
            "L = Learner(cfg, None, quiet=True); L.load_state_dict(state)\n"
            "print(json.dumps(L.evaluate()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(run / "checkpoints" / "latest.pt")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESTORE))
def test_a_restored_apex_run_evaluates_as_at_save_time_and_does_not_collapse(ray_local, tmp_path, name):
    """Ape-X with 2 Ray collectors, seeds 0-2, trained to a checkpoint (final evaluation, 10
    episodes) that reaches the issue's bar on every seed (DQN CartPole >= 475, DDPG Pendulum
    >= -200). In a fresh process the restored checkpoint evaluates exactly as at save time;
    `corral resume` for 5k more steps ends no worse than the save-time evaluation minus the
    spread of the save-time evaluations over the three seeds (at least 25 on CartPole: when
    every seed is saved at 500 the spread is 0, and 475 is the bar of having learned)."""
    import subprocess
    import sys

    algo, env, steps, extra, least, resume_args = RESTORE[name]
    saved, after, at_steps = [], [], []
    for seed in (0, 1, 2):
        run = tmp_path / f"s{seed}"
        corral.train(algo, env, steps=steps, seed=seed, run_dir=str(run),
                     **{"scheme.collectors": 2, "eval.episodes": 10, "tensorboard": False, **extra})
        at_save = json.loads((run / "eval.json").read_text())
        assert at_save["mean_return"] >= least, (seed, at_save["mean_return"])
        restored = _fresh_process_eval(run)
        for key in ("mean_return", "std_return", "min_return", "max_return"):
            assert restored[key] == at_save[key], (seed, key, restored, at_save)
        saved_steps = int(load_checkpoint(run / "checkpoints" / "latest.pt")["counters"]["env_steps"])
        out = subprocess.run([sys.executable, "-m", "corral.cli", "resume", str(run), "--steps",
                              str(saved_steps + 5000), *resume_args], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-4000:]
        at_steps.append(saved_steps)
        saved.append(at_save["mean_return"])
        after.append(json.loads((run / "eval.json").read_text())["mean_return"])
    spread = max(saved) - min(saved)
    tolerance = max(spread, 25.0 if env == "CartPole-v1" else 1e-9)
    print(f"\n{name} restore: saved at {at_steps} steps: {saved}; after+5k={after} spread={spread:.1f}")
    for s, a in zip(saved, after):
        assert a >= s - tolerance, (saved, after, spread)


def _memory_mb() -> tuple[float, float]:
    """(resident MB of this process and every process of its Ray session, its descendants:
    raylet, GCS, workers; the object store's MB in use, from Ray's memory summary)."""
    import re

    import psutil
    import ray
    from ray._private.internal_api import memory_summary

    me = psutil.Process()
    rss = 0
    for p in [me] + me.children(recursive=True):
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            pass
    # this session's cluster: without an address Ray picks the newest one on the machine
    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    store = re.search(r"Plasma memory usage (\d+(?:\.\d+)?) MiB", text)
    return rss / 2**20, float(store.group(1)) if store else 0.0


@pytest.mark.slow
def test_chaos_an_apex_run_with_random_kills_every_minute_ends_as_undisturbed_runs(ray_local, tmp_path):
    """About 20 minutes: Ape-X DQN on CartPole, 2 collectors and 2 gradient workers, one random
    part (collector, gradient worker, replay server) killed every 60 s. Its held-out return is
    within the spread of three undisturbed runs (seeds 0-2, same budget) of their worst, and
    resident and object-store memory sampled every minute after the first five do not grow
    by more than 25% (no fragment or parameter-version leak)."""
    import threading

    over = {"scheme.collectors": 2, "scheme.grad_workers": 2, "checkpoint.every": 5000, "eval.episodes": 10,
            "tensorboard": False, "progress": False}
    steps = 60_000
    calm = []
    for seed in (0, 1, 2):
        corral.train("apex_dqn", "CartPole-v1", steps=steps, seed=seed, run_dir=str(tmp_path / f"calm{seed}"), **over)
        calm.append(held_out(tmp_path / f"calm{seed}"))
    cfg = build_config("apex_dqn", "CartPole-v1", steps=steps, seed=0, overrides=over)
    cfg.scheme.max_restarts = cfg.scheme.max_replay_restarts = cfg.scheme.max_grad_restarts = 100
    L = Learner(cfg, new_run_dir(cfg, str(tmp_path / "chaos")), quiet=True)
    scheme, killed = ray_scheme_killing(L, ray_local, "chaos", after=60, times=100)
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(60):
            samples.append(_memory_mb())

    threading.Thread(target=sample, daemon=True).start()
    L.train()
    done.set()
    score = held_out(tmp_path / "chaos")
    spread = max(calm) - min(calm)
    print(f"\nchaos: kills={killed} restarts collector/grad/replay={scheme.restarts}/{scheme.grad_restarts}/"
          f"{scheme.replay_restarts} lost={scheme.replay_lost} held_out={score:.1f} calm={calm} "
          f"memory (rss MB, object store MB) per minute={[(round(r), round(o)) for r, o in samples]}")
    assert len(killed) >= 5
    assert score >= min(calm) - spread, (score, calm)
    if len(samples) > 8:
        warm = samples[5]
        assert max(r for r, _ in samples[5:]) <= 1.25 * warm[0] + 50, samples
        assert max(o for _, o in samples[5:]) <= 1.25 * warm[1] + 50, samples
