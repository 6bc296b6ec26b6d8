import json, sys, time
from graphc.runtime.engine import Engine, read_jsonl, parse_or_refuse
from graphc.runtime.batch import throughput
e = Engine("plans/qwen3_5_9b_h200.plan", None, random_weights=True)
print(e.summary(), flush=True)
items = read_jsonl(".scratch/i2t.jsonl")
e.generate(items[:2])
out = {}
for c, part in ((16, items[2:18]), (32, items[16:48])):
    t0 = time.perf_counter(); outs = e.generate(part); wall = time.perf_counter() - t0
    tp = throughput([o for o in outs if o.error is None], wall)
    tp["errors"] = [o.error for o in outs if o.error][:2]
    tp["prompt_tokens_mean"] = sum(o.prompt_tokens for o in outs) / len(outs)
    out[c] = tp
    print(c, json.dumps(tp), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
