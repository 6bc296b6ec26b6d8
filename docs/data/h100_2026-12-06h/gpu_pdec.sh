#!/bin/bash
# One call: the paged-triton GPU tests, the kernel against fa2, then the Omni decode steps on the shipped 80 GB plan
# (triton decode) and on the same plan with decode_backend=fa2.
source .gpu/enter.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 python -m pytest -q -p no:cacheprovider tests/gpu/test_paged_triton_gpu.py 2>&1 | tail -3 | tee $OUT/pytest_paged_triton.txt
timeout 80 python examples/bench/bench_paged_decode.py $OUT/paged_decode.json --seqs 1 4 16 64 --keys 256 2048 8192 2>&1 \
  | grep -vE "^USDT|Warn|INFO" | sed -E 's/ \(err [0-9.e-]+, append exact\)//g' | tail -30
G="thinker/decode:seqs/1 thinker/decode:seqs/16 talker/decode:seqs/1"
for p in plans/qwen3_omni_h100_seed80gb_fit.plan .gpus/omni80_fa2decode.plan; do
  n=$(basename $p .plan)
  timeout 130 python examples/bench/ab_kernels.py $OUT/ab_$n.json --plan $p --drop moe_sm90_from --no-again --sampled --graphs $G 2>&1 | grep -vE "^USDT|Warn|INFO" | tail -6
done
