#!/usr/bin/env bash
# The GPU machine's image has no nvidia-cutlass-dsl (FlashInfer's CuTe-DSL kernels need it: the SM90 MoE
# experts, models/components/moe_sm90.py), and its wheels unpack to 246 MB, over one device call's 64 MiB
# carry. This packs them as two parts, .cdslA (the 193 MB MLIR library alone, 48 MiB) and .cdslB (the rest,
# 16 MiB), ignored by git. Usage, at the project root: bash examples/tools/pack_cutlass_dsl.sh
# Then two device calls back to back (the machine keeps /tmp while it stays warm):
#   carry [".cdslA"]:                  mkdir -p /tmp/cdsl-site && tar xJf .cdslA/cdslA.tar.xz -C /tmp/cdsl-site
#   carry [".cdslB", ".gpu", ...]:     tar xJf .cdslB/cdslB.tar.xz -C /tmp/cdsl-site && source .gpu/enter.sh &&
#       export PYTHONPATH=$PYTHONPATH:/tmp/cdsl-site:/tmp/cdsl-site/nvidia_cutlass_dsl/dsl_packages && ...
# (the second call should first test that part A is still there: a fresh machine has lost it).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
VERSION=${CUTLASS_DSL_VERSION:-4.8.1}
for d in .cdslA .cdslB; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$work/whl" "nvidia-cutlass-dsl==$VERSION" \
  "nvidia-cutlass-dsl-libs-base==$VERSION" "nvidia-cutlass-dsl-libs-core==$VERSION" \
  "nvidia-cutlass-dsl-libs-cu13==$VERSION"
mkdir -p "$work/site" .cdslA .cdslB
for w in "$work"/whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done
big=$(cd "$work/site" && ls nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.*.so)
tar -C "$work/site" -cf - "$big" | xz -T0 -9e > .cdslA/cdslA.tar.xz
tar -C "$work/site" --exclude="$big" -cf - . | xz -T0 -9e > .cdslB/cdslB.tar.xz
ls -la .cdslA .cdslB
