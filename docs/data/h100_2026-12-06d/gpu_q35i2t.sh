#!/bin/bash
# Qwen3.5-9B images (MMMU-size) at 16 and 32 streams, plan by card.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then PLAN=plans/qwen3_5_9b_h200.plan; else PLAN=plans/qwen3_5_9b_h100.plan; fi
echo "plan $PLAN" | tee -a $OUT/gpu.txt
timeout ${1:-560} python examples/bench/bench_batches.py $PLAN --random-weights --requests .q35req/i2t.jsonl \
  --concurrency 16 32 --json $OUT/i2t_q35.json 2>&1 | tee $OUT/i2t_q35.txt | tail -20
