#!/bin/bash
# On an H200: seed 001's video cells at the default bounds (no profile). On an H100: the 8 s cells with
# Python's switch interval at 5 ms (default) and 0.5 ms, one boot each, for the GIL-contention question.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt; nproc | tee -a $OUT/gpu.txt
timeout 60 python .gpus/prep_threads.py 2>&1 | grep -v Warn | tee -a $OUT/prep.txt
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456 timeout 60 python .gpus/prep_threads.py 2>&1 | grep -v Warn | tee -a $OUT/prep.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout ${T:-560} python examples/bench/bench_video.py plans/qwen3_5_9b_h200.plan $OUT/video_default.json --random-weights \
    --tokenizer .tok --streams 16 32 --seconds 60 30 8 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
    > $OUT/video_default.txt 2>&1
  grep -vE "^USDT|^\[W|Warning|warn" $OUT/video_default.txt | grep -E "booted|peak|round|GPU|ms  |^\|" | tail -22
else
  for SI in 5 0.5 5 0.5; do
    timeout 330 python examples/bench/bench_video.py plans/qwen3_5_9b_h100.plan $OUT/video_si$SI.json --random-weights \
      --tokenizer .tok --streams 16 32 --seconds 8 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
      --switch-interval $SI >> $OUT/video_si$SI.txt 2>&1
    echo "== si $SI"; grep -vE "^USDT|^\[W|Warning|warn" $OUT/video_si$SI.txt | grep -E "booted|^\|" | tail -6
  done
fi
