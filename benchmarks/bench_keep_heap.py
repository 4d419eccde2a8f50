"""keep_heap's effect on a gradient step, A/B inside one process: glibc's trim threshold toggled
(``mallopt``) between interleaved updates of 20 (SAC) or 128 (QR-DQN) gradient steps, after
2000 env steps of collection; process CPU and wall time per step and minor page faults per step.
"small" = a 1 MiB trim threshold (close to glibc's dynamic default for these sizes: the heap's top
goes back to the OS every step), "big" = keep_heap's 256 MiB.

    python benchmarks/bench_keep_heap.py sac
    python benchmarks/bench_keep_heap.py qrdqn
"""

import ctypes
import os
import resource
import sys
import time

import numpy as np
import torch

from corral.algos.base import Step
from corral.train.learner import Learner
from corral.train.setup import build_config

libc = ctypes.CDLL("libc.so.6")
torch.set_num_threads(1)
algo = sys.argv[1]
trim_small = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
env = "CartPole-v1" if algo in ("qrdqn","dqn") else "Pendulum-v1"
cfg = build_config(algo, env, steps=20000, seed=0, sets=["keep_heap=false","progress=false","eval.episodes=0","tensorboard=false","threads=1"])
L = Learner(cfg, None)
A, obs = L.algo, L.obs
with torch.no_grad():
    for _ in range(2000):
        a, ex = A.explore(obs)
        nxt, r, te, tr, info = L.env.step(a)
        A.observe(Step(obs, ex, r, te, tr, info["final_obs"], nxt))
        obs = nxt
G = 20 if algo not in ("qrdqn", "dqn") else 128
A.cfg.gradient_steps = G
A.update(0.5)
res = {"small": [], "big": []}
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 12):
    for name in (("small", "big") if i % 2 == 0 else ("big", "small")):
        libc.mallopt(-1, trim_small if name == "small" else 256 << 20)
        r0, t, w = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        A.update(0.5)
        r1=resource.getrusage(resource.RUSAGE_SELF)
        res[name].append(((time.process_time()-t)/G*1e3, (time.perf_counter()-w)/G*1e3, (r1.ru_minflt-r0.ru_minflt)/G))
for name, v in res.items():
    v = np.array(v)
    print(f"{algo} trim={name}: cpu ms/step min {v[:,0].min():.2f} med {np.median(v[:,0]):.2f} | wall min {v[:,1].min():.2f} med {np.median(v[:,1]):.2f} | faults/step {np.median(v[:,2]):.0f}")
print("load", os.getloadavg())
