#!/bin/bash
# Host preprocessing of 16 clips at once (CPU), the GDN conv kernels captured, the GDN GPU tests, then seed 001's
# video cells at the default bounds on the tree's plan (gdn_conv_rows chosen).
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt; nproc | tee -a $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then C=h200; else C=h100; fi
for B in default ckpt; do
  X=""; [ $B = ckpt ] && X="--video-pixels 4096 25165824"
  timeout 90 python examples/bench/bench_prepare.py --model models/qwen3_5.py --preset 9b --tokenizer .tok --seconds 60 \
    --repeats 3 --concurrent 16 $X 2>&1 | tee $OUT/prepare16_$B.txt
done
timeout 90 python examples/bench/bench_prefill_kernels.py --only conv --json $OUT/conv_rows.json 2>&1 | tail -4
timeout 150 python -m pytest -q -s -p no:randomly --tb=short tests/gpu/test_gated_deltanet_gpu.py tests/gpu/test_gdn_fused_gpu.py \
  > $OUT/pytest_gdn.txt 2>&1; grep -E "passed|failed|Error|peak" $OUT/pytest_gdn.txt | tail -6
timeout ${T:-300} python examples/bench/bench_video.py plans/qwen3_5_9b_$C.plan $OUT/video_q35.json --random-weights \
  --tokenizer .tok --streams 16 32 --seconds 60 30 8 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
  > $OUT/video_q35.txt 2>&1; grep -E "^\||booted|peak" $OUT/video_q35.txt | tail -9
