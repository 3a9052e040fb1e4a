#!/usr/bin/env bash
# The GPU checks, as run on the device machine (an H100/H200 with PyTorch for CUDA, Triton
# and transformers, no package index): the packages it lacks come as wheels in .whl
# (tests/gpu/fetch_wheels.sh makes them here), then the steps named in STEPS:
#   tests  the `gpu` tests (TESTS_TIMEOUT_S, default 300)
#   bench  `omnistage bench cuda` with this script's arguments (default: the full workload)
#   omni   `omnistage bench omni --device cuda` (demo-omni's time to first audio)
# Usage: STEPS="tests bench omni" tests/gpu/device_check.sh [bench cuda arguments...]
# Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}
STEPS=${STEPS:-tests bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
cli="python3 -m omnistage.entrypoints.cli"
for step in $STEPS; do
    case $step in
    tests)
        timeout "${TESTS_TIMEOUT_S:-300}" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
            -o addopts="" -rfE --durations=10 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    bench)
        timeout 500 $cli bench cuda --model-dir /tmp/qwen3-0.6b "$@" 2>&1 \
            | tee "$OUT/bench_cuda.log" | tail -12 ;;
    omni)
        timeout 300 $cli bench omni --device cuda --concurrency 1,16 --repeat 1 2>&1 \
            | tee "$OUT/bench_omni.log" | tail -12 ;;
    esac
done
