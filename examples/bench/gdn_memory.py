"""One Gated DeltaNet layer at Qwen3.5-9B's shapes (hidden 4096, 16 key and 32 value heads of 128), run eagerly on
fla-core's kernels three times on 16 prompts of 512 rows, one of 8,192 and three of 100: each call's time, peak
allocated and reserved bytes beside the peak the compiler's trace of the same call gives (graphc.simulate on
meta tensors, delta_rule.fla_allocations in the kernels' place). The first call at new shapes includes the
autotuners' runs. CUDA and fla-core needed.

    python examples/bench/gdn_memory.py
"""
import time

import torch
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from resources.linear_state import StateStep, new_state
from graphc.simulate import _Recorder
CFG = GatedDeltaNetConfig(hidden_size=4096, linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128)
spec = state_spec(CFG, "s", 1, conv_dtype="bfloat16")
for lens in ([512] * 16, [8192], [100] * 3):
    m = GatedDeltaNet(CFG, 0).to("meta", torch.bfloat16); m.fla_gdn = 1
    st = new_state(spec, 17, "meta"); x = torch.empty(sum(lens), 4096, device="meta", dtype=torch.bfloat16)
    rec = _Recorder(list(m.parameters()) + [x, st.conv, st.recurrent])
    with rec, torch.inference_mode():
        y = m(x, StateStep(st, list(range(len(lens))), lens, [False] * len(lens)))
    m = GatedDeltaNet(CFG, 0).to("cuda", torch.bfloat16); m.fla_gdn = 1
    st = new_state(spec, 17, "cuda"); x = torch.randn(sum(lens), 4096, device="cuda", dtype=torch.bfloat16)
    for i in range(3):
        torch.cuda.synchronize(); torch.cuda.empty_cache()
        base, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats(); t = time.perf_counter()
        with torch.inference_mode():
            y = m(x, StateStep(st, list(range(len(lens))), lens, [False] * len(lens)))
        torch.cuda.synchronize()
        print(f"{len(lens)}x{lens[0]} call {i}: {1e3*(time.perf_counter()-t):.1f} ms peak {torch.cuda.max_memory_allocated()-base:,} "
              f"reserved+ {torch.cuda.max_memory_reserved()-r0:,} traced {rec.peak:,}", flush=True)
        del y
    del m, st, x
