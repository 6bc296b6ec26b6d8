#!/bin/bash
# The plan with gdn_conv_rows: 60 s clips x 16 streams at the default and checkpoint bounds; then a 16-stream
# round of 60 s clips at the default bounds under torch.profiler.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then C=h200; else C=h100; fi
P=.gpus/q35_${C}_convrows.plan
timeout 200 python examples/bench/bench_video.py $P $OUT/video60_default_convrows.json --random-weights --tokenizer .tok \
  --streams 16 --seconds 60 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 \
  --profile $OUT/profile16_default_convrows.txt --profile-streams 16 > $OUT/video60_default_convrows.txt 2>&1
grep -E "^\| 60|booted" $OUT/video60_default_convrows.txt | tail -2; head -3 $OUT/profile16_default_convrows.txt
timeout 200 python examples/bench/bench_video.py $P $OUT/video60_ckpt_convrows.json --random-weights --tokenizer .tok \
  --streams 16 --seconds 60 --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats 1 --video-pixels 4096 25165824 \
  > $OUT/video60_ckpt_convrows.txt 2>&1; grep -E "^\| 60|booted" $OUT/video60_ckpt_convrows.txt | tail -2
