#!/usr/bin/env bash
# The GPU machine's image lacks graphc run's server (fastapi, uvicorn and kin) and the Qwen3.5 kernels'
# fla-core; ../shared/gpu/pack.sh packs flashinfer and pydantic only. This packs .gpu/ with those too:
#   1. ../shared/gpu/pack.sh with the server's packages (their dependencies resolved for CPython 3.12;
#      torch, triton, numpy and nvidia-* are skipped: the image has them);
#   2. fla-core and einops added without dependencies (fla-core asks for torch, which the image has).
# Usage, at the project root: bash examples/tools/pack_gpu_extras.sh
# Then carry [".gpu", ...] and begin each device command with `source .gpu/enter.sh`. enter.sh unpacks only
# where /tmp/gpu-site is absent: a machine still warm from a call with the older pack keeps the older one.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
SERVER=(fastapi "uvicorn>=0.29" "python-multipart>=0.0.18" "prometheus-client>=0.20" "jsonschema>=4.18"
        "websockets>=13" "jinja2>=3.1.6" "tokenizers>=0.20" "tqdm>=4.66")
KERNELS=("fla-core==${FLA_CORE_VERSION:-0.6.0}" einops)
"$(dirname "$root")/shared/gpu/pack.sh" "${SERVER[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$work/whl" "${KERNELS[@]}"
mkdir -p "$work/site"
xz -dc .gpu/site.tar.xz | tar -x -C "$work/site"
for w in "$work"/whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done
tar -C "$work/site" -cf - . | xz -T0 -6 > .gpu/site.tar.xz
ls -la .gpu/site.tar.xz
echo "packed: flashinfer, pydantic, ${SERVER[*]}, ${KERNELS[*]}"
