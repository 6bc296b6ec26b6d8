#!/bin/bash
# Qwen3.5-9B video cells (seed 001): 60/30/8 s clips at 16 and 32 streams, plan by card.
source .gpu/enter.sh
mkdir -p /tmp/gpx-site && tar xJf .gpx/gpx.tar.xz -C /tmp/gpx-site && export PYTHONPATH=$PYTHONPATH:/tmp/gpx-site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then PLAN=plans/qwen3_5_9b_h200.plan; else PLAN=plans/qwen3_5_9b_h100.plan; fi
echo "plan $PLAN" | tee -a $OUT/gpu.txt
python -c "import fla, flashinfer, torch; print('fla', fla.__version__, 'flashinfer', flashinfer.__version__, 'torch', torch.__version__)" | tee -a $OUT/gpu.txt
python -m pytest -q -p no:randomly tests/gpu/test_gated_deltanet_gpu.py tests/gpu/test_gdn_fused_gpu.py tests/gpu/test_norm_triton_gpu.py -k "not vision" 2>&1 | tail -3 | tee $OUT/pytest_kernels.txt
timeout ${1:-560} python examples/bench/bench_video.py $PLAN $OUT/video_q35.json --random-weights --tokenizer .tok \
  --streams 16 32 --seconds ${SECS:-8 30 60} --fps 2 --size 360 640 --prompt 64 --tokens 128 --repeats ${REP:-1} ${VPIX:+--video-pixels $VPIX} 2>&1 | tee $OUT/video_q35.txt | grep -vE '^\s*$' | tail -40
