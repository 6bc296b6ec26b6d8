#!/bin/bash
# A/B on one machine: the 9B h100 plan with 64 frame groups a video step (before) and the tree's (videos 16,
# frame groups 512): 16 clips of 60 s and of 30 s at the default bounds, then the 60 s round profiled.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt; nproc | tee -a $OUT/gpu.txt
git log --oneline -1 | tee -a $OUT/gpu.txt
for ARM in ${ARMS:-frame64 tree}; do
  P=plans/qwen3_5_9b_h100.plan; [ $ARM = frame64 ] && P=.gpus/q35_h100_frame64.plan
  timeout ${T:-420} python examples/bench/bench_video.py $P $OUT/video_$ARM.json --random-weights \
    --tokenizer .tok --streams 16 --seconds 60 30 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
    --profile $OUT/profile_$ARM.txt --profile-streams 16 > $OUT/video_$ARM.txt 2>&1
  grep -vE "^USDT|^\[W|Warning|warn" $OUT/video_$ARM.txt | grep -E "booted|peak|round|GPU|ms  |^\|" | tail -24
done
