import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")


# The files that start a simulated multi-node Ray cluster (ray.cluster_utils): one worker runs them
# all, one after another, so two such clusters never run at once.
RAY_CLUSTER_FILES = {"test_bench", "test_node_loss"}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the README's ``-n 2 --dist loadgroup``) each test file is one group,
    run whole on one worker, so its module-scoped fixtures are built once as in a serial run;
    the Ray cluster files share one group. Without xdist the marks change nothing."""
    for item in items:
        name = item.path.stem
        item.add_marker(pytest.mark.xdist_group("ray_cluster" if name in RAY_CLUSTER_FILES else name))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def ray_local():
    """A small local Ray (2 CPUs), started once and shared by the tests that need one."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # a new instance even where a cluster was started on this machine (`ray start`, a test's Cluster)
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    return ray


def ray_scheme_killing(learner, ray, part: str = "collector", after: int = 10, index: int = 1, times: int = 1):
    """A Ray scheme for ``learner`` that kills one of its parts mid-run with ``ray.kill`` (no Ray
    restart: corral must restart it); returns ``(scheme, killed)``, ``killed`` one entry per kill.

    ``part``: ``"collector"`` (collector ``index``) or ``"replay"`` (the replay server), killed
    once ``after`` fragments were consumed (and again every ``after`` more, ``times`` in all);
    ``"grad"``: gradient worker ``index``, killed just before the pool's ``after``-th call or
    submission (so that call, and the step it belongs to, is in flight on a dead worker);
    ``"chaos"``: every ``after`` seconds a random collector, gradient worker or the replay server
    (``index`` seeds the choice)."""
    from corral.schemes.ray_scheme import RayScheme

    scheme = RayScheme(learner)
    killed: list = []

    if part in ("collector", "replay"):
        def kill(meta, data):
            if len(killed) < times and scheme.fragments == after * (len(killed) + 1):
                ray.kill(scheme.pool.actors[index] if part == "collector" else scheme.replay_actor, no_restart=True)
                killed.append(scheme.fragments)

        scheme.fragment_callback = kill
    elif part == "grad":
        make = scheme.make_grad_pool
        calls = [0]

        def make_killing(algo):
            pool = make(algo)
            for name in ("call", "submit"):
                def counted(*args, _inner=getattr(pool, name), **kw):
                    calls[0] += 1
                    if len(killed) < times and calls[0] == after * (len(killed) + 1):
                        ray.kill(pool.workers[index], no_restart=True)
                        killed.append(calls[0])
                    return _inner(*args, **kw)
                setattr(pool, name, counted)
            return pool

        scheme.make_grad_pool = make_killing
    elif part == "chaos":  # every ``after`` seconds, one part at random (``times`` kills at most)
        import random
        import threading

        pick, stop = random.Random(index), threading.Event()

        def chaos():
            while not stop.wait(after) and len(killed) < times:
                parts = [("collector", a) for a in (scheme.pool.actors if scheme.pool else [])]
                parts += [("grad", w) for w in (scheme.grad_pool.workers if scheme.grad_pool else [])]
                parts += [("replay", scheme.replay_actor)] if getattr(scheme, "replay_actor", None) else []
                if parts:
                    name, actor = pick.choice(parts)
                    ray.kill(actor, no_restart=True)
                    killed.append(name)

        close = scheme.close

        def close_and_stop(*args, **kw):
            stop.set()
            return close(*args, **kw)

        scheme.close = close_and_stop
        threading.Thread(target=chaos, daemon=True).start()
    else:
        raise ValueError(part)
    learner.make_stream = scheme.stream
    return scheme, killed
