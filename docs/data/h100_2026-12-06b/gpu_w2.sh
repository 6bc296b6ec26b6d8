#!/bin/bash
# GDN GPU tests (full output of failures), then 60 s clips x 16 streams at the default and the checkpoint bounds:
# the shipped plan, then the plan with gdn_conv_rows.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then C=h200; else C=h100; fi
PLAN=plans/qwen3_5_9b_$C.plan; ALT=.gpus/q35_${C}_convrows.plan
timeout 170 python -m pytest -q -s -p no:randomly --tb=short tests/gpu/test_gdn_fused_gpu.py tests/gpu/test_gated_deltanet_gpu.py \
  tests/gpu/test_norm_triton_gpu.py > $OUT/pytest_gdn.txt 2>&1; grep -E "passed|failed|Error|assert|peak" $OUT/pytest_gdn.txt | tail -12
for V in shipped; do
  P=$PLAN; [ $V = convrows ] && P=$ALT
  for B in default ckpt; do
    X=""; [ $B = ckpt ] && X="--video-pixels 4096 25165824"
    timeout ${T:-240} python examples/bench/bench_video.py $P $OUT/video60_${B}_$V.json --random-weights --tokenizer .tok \
      --streams 16 --seconds 60 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 $X \
      > $OUT/video60_${B}_$V.txt 2>&1; grep -E "^\| 60|booted" $OUT/video60_${B}_$V.txt | tail -2
  done
done
