#!/bin/bash
# Seed 001's video cells on the tree's 9B plan: the default bounds (with the 60 s x 16 round profiled), then the
# checkpoint's bounds.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt; nproc | tee -a $OUT/gpu.txt
git log --oneline -1 | tee -a $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then C=h200; else C=h100; fi
for B in ${BS:-default ckpt}; do
  X="${PROF---profile $OUT/profile_default.txt --profile-streams 16}"; [ $B = ckpt ] && X="--video-pixels 4096 25165824"
  timeout ${T:-300} python examples/bench/bench_video.py ${PLAN:-plans/qwen3_5_9b_$C.plan} $OUT/video_$B.json --random-weights \
    --tokenizer .tok --streams 16 32 --seconds 60 30 8 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
    $X > $OUT/video_$B.txt 2>&1
  grep -vE "^USDT|^\[W|Warning|warn" $OUT/video_$B.txt | grep -E "booted|peak|round|GPU|ms  |^\|" | tail -22
done
