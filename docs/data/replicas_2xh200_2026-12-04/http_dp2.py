import json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
port = int(sys.argv[1])
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.loads(r.read())
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
    except Exception: time.sleep(1)
same = [11 * j % 1000 + 100 for j in range(128)]
bodies = [{"model": "qwen3_5-9b", "prompt": same, "max_tokens": 32, "temperature": 0, "ignore_eos": True} for _ in range(16)]
bodies += [{"model": "qwen3_5-9b", "prompt": [(7 * i + 13 * j) % 5000 + 100 for j in range(128)], "max_tokens": 64, "temperature": 0, "ignore_eos": True} for i in range(48)]
t0 = time.time()
with ThreadPoolExecutor(64) as pool:
    res = list(pool.map(post, bodies))
wall = time.time() - t0
ok = [b for s, b in res if s == 200]
toks = [b["choices"][0]["token_ids"] for b in ok]
print(f"{len(ok)} of {len(res)} answered 200 in {wall:.2f} s; {sum(map(len, toks))} tokens")
print("the 16 identical prompts got identical tokens:", all(t == toks[0] for t in toks[:16]))
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
print("\n".join(l for l in m.splitlines() if l.startswith("graphc_walk_steps") or l.startswith("graphc_requests_total")))
