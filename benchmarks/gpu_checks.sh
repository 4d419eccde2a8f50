#!/usr/bin/env bash
# The checks and figures that need a CUDA GPU, in one pass (a lent GPU's minutes are few):
#   1. the CUDA tests: the graphed step against the eager one on the GPU, buffers, native envs,
#      MaxCut and checkpoints on the device (each part skips itself where no GPU is present);
#   2. training throughput at LeanRL's settings (benchmarks/bench_leanrl_gpu.py);
#   3. eager against CUDA-graphed gradient steps of the value family on Atari (bench_gpu_step.py);
#   4. MaxCut's GPU path on Gset G70 (bench_maxcut.py), when the graph file is at $GSET.
# Usage: OUT=/tmp/gpu bash benchmarks/gpu_checks.sh   (logs and JSON land in $OUT)
# On a machine without the envs installed, put their wheels in .whl/ first (Gymnasium, MuJoCo,
# ale-py): they are installed to /tmp/site for this shell only.
set -u
OUT=${OUT:-/tmp/gpu_checks}
GSET=${GSET:-.gdata}
TIMED=${TIMED:-6000}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch, gymnasium, mujoco, ale_py; print(torch.__version__, torch.cuda.get_device_name(), gymnasium.__version__, mujoco.__version__, ale_py.__version__)"
echo "== 1. CUDA tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m "not slow" -n 4 tests/test_cuda_graph.py tests/test_ondevice.py \
  tests/test_native_envs.py tests/test_replay.py tests/test_traps.py tests/test_maxcut.py -rs 2>&1 | tee "$OUT/tests.log" | tail -25
echo "== 2. LeanRL settings"
timeout 300 python3 benchmarks/bench_leanrl_gpu.py --device cuda --timed "$TIMED" --json "$OUT/leanrl_gpu.json" 2>&1 \
  | grep -v "^A.L.E\|Powered by" | tee "$OUT/leanrl.log" | tail -14
echo "== 3. graphed steps, Atari value family"
timeout 120 python3 benchmarks/bench_gpu_step.py --device cuda --cuda-graph --algos rainbow dqn --updates 200 \
  --json "$OUT/gpu_step.json" 2>&1 | grep -v "^A.L.E\|Powered by" | tail -5
if [ -f "$GSET/G70.txt" ]; then
  echo "== 4. MaxCut G70 on the GPU"
  timeout 90 python3 benchmarks/bench_maxcut.py --graphs G70 --methods ppo --time-limit 40 --envs 256 --device cuda \
    --data "$GSET" 2>&1 | tail -4 | tee "$OUT/maxcut.log"
fi
