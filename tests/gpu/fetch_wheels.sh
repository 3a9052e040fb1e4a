#!/usr/bin/env bash
# The wheels the device machine lacks (its image has PyTorch for CUDA, Triton, transformers,
# numpy, onnx, pytest; no package index), fetched here for its Python 3.12 into .whl/
# (git-ignored), which `tests/gpu/device_check.sh` installs there. Versions: constraints.txt's.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .whl
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
    platforms+=(--platform "$p")
done
for pkg in gguf msgspec pyzmq diffusers importlib_metadata fastapi starlette pydantic \
    pydantic_core uvicorn websockets soundfile cffi pycparser soxr python-multipart \
    annotated_types typing_inspection hypothesis; do
    pin=$(grep -i "^${pkg//_/[-_]}==" constraints.txt || echo "$pkg")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .whl "$pin"
done
