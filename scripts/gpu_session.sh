#!/usr/bin/env bash
# The prepared device check of the model stack, for a session lent the GPU machine (one H200).
# Run it there as ONE command with `carry: [".whl"]`, a timeout of ~580 s, and results under
# $OUT (at most 8 files come back). It installs the project beside the machine's own torch
# (diffusers and gymnasium travel as wheels: ../shared/reference/gpu-device.md), runs the GPU
# tests (bf16 parity with diffusers, CPU/GPU agreement, batch invariance, compiled Triton
# kernels against eager at Nano layer widths, CUDA-graph replay against eager), then the
# synthetic Cosmos3-Nano benchmark (DROID-size at B=1, 2 with diffusers' reference; the LIBERO
# batch curve with every option flipped), which docs/benchmarks.md's GPU section is made of.
# To commit a session's results: copy $OUT's files to docs/gpu_results/<date>/, add a
# session.json there (date, commit, each file's command line), then
#   python3 scripts/collect_gpu_results.py docs/gpu_results/<date> docs/bench_gpu_nano.json
#
# Here, once, in the repository root (wheels for the GPU machine's Python 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1 \
#     gymnasium==1.4.0 farama-notifications==0.0.6 importlib_metadata==8.7.0
#
# Stages (each can be run alone to fit the device budget): checks, bench; default both.
set -uo pipefail
OUT="${OUT:-/tmp/cosmos3-gym-gpu}"
mkdir -p "$OUT"
stages="${*:-checks bench}"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

# Budgets: 150 + 140 + 230 s of commands, plus the install, under one 580 s call. Every bench
# JSON is rewritten after each measurement, so a stage cut short still returns its rows.
if [[ " $stages " == *" checks "* ]]; then
  # test_gpu.py is marked gpu; the kernel and graph tests run compiled wherever CUDA is.
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
    tests/test_model_kernels.py tests/test_model_cuda_graphs.py 2>&1 | tail -40 \
    > "$OUT/pytest_gpu.log"
fi
if [[ " $stages " == *" bench "* ]]; then
  # DROID-size B=1 at 30 steps is the number sglang published (1.457 s on an H200); with
  # diffusers' reference step beside it, no flips (they would take minutes at this size).
  timeout 140 python3 -m cosmos3_gym.eval.cli bench --synthetic nano --device cuda \
    --cases droid_480x832 --batch-sizes 1,2 --steps 30 --no-flips --warmup 1 --repeats 3 \
    --out "$OUT/bench_gpu_nano_droid.json" > "$OUT/bench_gpu_nano_droid.txt" 2>&1
  # LIBERO: the batch curve (TFLOP/s, GPU busy, B=2 vs B=4) and every option flipped at B=1, 8.
  timeout 230 python3 -m cosmos3_gym.eval.cli bench --synthetic nano --device cuda \
    --cases libero_256x512 --batch-sizes 1,2,4,8,16 --steps 30 --compare-batch 8 \
    --warmup 1 --repeats 3 --no-reference \
    --out "$OUT/bench_gpu_nano_libero.json" > "$OUT/bench_gpu_nano_libero.txt" 2>&1
fi
ls -la "$OUT"
