#!/usr/bin/env bash
# The GPU checks, as run on the device machine (an H100/H200 with PyTorch for CUDA, Triton
# and transformers, no package index): the packages it lacks come as wheels in .whl
# (docs/cuda.md says which), then the `gpu` tests, then `omnistage bench cuda`.
# Usage: tests/gpu/device_check.sh [TEST_TIMEOUT_S] [BENCH ARGS...]; logs go to $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
tests_timeout=${1:-300}
shift || true
timeout "$tests_timeout" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    -o addopts="" -rfE 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
timeout 400 python3 -m omnistage.entrypoints.cli bench cuda --model-dir /tmp/qwen3-0.6b "$@" \
    2>&1 | tee "$OUT/bench_cuda.log" | tail -12
