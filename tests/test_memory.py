"""Memory of distributed parts over a long run (issue 19: no growth after warm-up).

A collector keeps nothing per fragment or per parameter version, and the chaos benchmark's
memory sampler tells a process's own memory from the object store's shared pages it maps
(what made collectors look as if they grew ~2.4 MB/min: docs/ledger.md).
"""

import gc
import json
import os
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from corral.schemes.collector import Collector, collector_state
from corral.train.setup import build_config

ROOT = Path(__file__).resolve().parents[1]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_apex_collector_keeps_nothing_per_fragment_or_parameter_version():
    """The Ape-X collector loop as a Ray actor runs it (a freshly deserialised parameter
    version every fragment, the resume state asked for): after a warm-up, 100 more fragments
    leave the Python objects, Python allocations and resident memory where they were."""
    cfg = build_config("apex_dqn", "CartPole-v1", steps=50_000, seed=0,
                       overrides={"scheme.collectors": 2, "tensorboard": False, "progress": False})
    c = Collector(cfg, "CartPole-v1", 0, 2)
    state = collector_state(c.algo)

    def fragments(start: int, count: int) -> None:
        for i in range(start, start + count):
            for v in state.values():
                v.add_(1e-4)  # a new version every fragment, as the learner's updates make them
            params = pickle.loads(pickle.dumps(state))  # new tensors, as read from the object store
            # past learning_starts: the greedy path and the initial priorities run
            meta, data = c.collect(params, i, env_steps=2000 + 256 * i, want_state=True)
            assert meta.version == i and data.priorities is not None

    tracemalloc.start()
    try:
        fragments(0, 30)  # warm-up: torch's and Python's caches, the env's first episodes
        gc.collect()
        objects, traced, resident = len(gc.get_objects()), tracemalloc.get_traced_memory()[0], rss()
        fragments(30, 100)
        gc.collect()
        grown_objects = len(gc.get_objects()) - objects
        grown_traced = tracemalloc.get_traced_memory()[0] - traced
        grown_rss = rss() - resident
    finally:
        tracemalloc.stop()
        c.close()
    # An object kept per fragment (its meta, a tensor, a list) is +100 objects; 32 KB of Python
    # allocations is ~330 bytes kept per fragment (torch's caches keyed by shapes, e.g. of the
    # episode ends a fragment holds, still add ~10 KB over these 100: bounded, they level off);
    # a fragment's data kept is ~+0.5 MB
    assert grown_objects <= 10, grown_objects
    assert grown_traced < 32 * 1024, grown_traced
    assert grown_rss < 4 * 2**20, grown_rss / 2**20


SAMPLER_CHECK = """
import json, mmap, os, sys, importlib.util
import ray  # noqa: F401 - puts its bundled psutil on the path
import psutil
spec = importlib.util.spec_from_file_location("chaos_apex", sys.argv[1])
chaos = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chaos)
me = psutil.Process(os.getpid())
size = int(sys.argv[2])
path = f"/dev/shm/plasma_corral_test_{os.getpid()}"  # named as Ray names its store
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
try:
    os.unlink(path)  # as Ray does: only the mappings and the open file keep it
    os.ftruncate(fd, size)
    rss0, store0 = chaos.process_memory(me)
    with mmap.mmap(fd, size) as m:
        m[:] = b"\\1" * size  # every page touched: resident in this process and in the file
        rss1, store1 = chaos.process_memory(me)
        footprint = chaos.store_footprint([os.getpid()])
finally:
    os.close(fd)
print(json.dumps([rss0, store0, rss1, store1, footprint, chaos.store_footprint([])]))
"""


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isdir("/dev/shm")), reason="/dev/shm")
def test_the_chaos_sampler_counts_object_store_pages_apart_from_a_process_own_memory():
    """A process that reads objects maps the store's file and its resident size counts the
    store's pages it touched: the sampler reports them apart (``process_memory``) and the
    store's own footprint once (``store_footprint``, the file's allocated pages). In a fresh
    process: this one may have mapped a real Ray store (an earlier test's ``ray.init``)."""
    pytest.importorskip("ray")  # psutil comes with Ray
    size = 32 * 2**20
    out = subprocess.run([sys.executable, "-c", SAMPLER_CHECK, str(ROOT / "benchmarks" / "chaos_apex.py"), str(size)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rss0, store0, rss1, store1, footprint, no_store = json.loads(out.stdout.strip().splitlines()[-1])
    assert store0 == 0
    assert store1 >= 0.95 * size  # the pages count in this process's RSS ...
    assert rss1 - rss0 >= 0.95 * size
    assert abs((rss1 - store1) - (rss0 - store0)) < 0.1 * size  # ... but not in its own memory
    assert footprint is not None and 0.95 * size <= footprint <= 1.05 * size
    assert no_store is None
