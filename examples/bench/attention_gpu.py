"""FlashInfer attention on the H200: every sm_90 backend of the capability table, on Qwen3-Omni's
attention shapes, eager and captured in a CUDA graph, against fp32 torch SDPA.

    source .gpu/enter.sh && python examples/bench/attention_gpu.py [--cases audio,thinker_decode] [--backends fa2]

For each (shape, backend): an eager step on a random layout; a graph captured on the rung's full
layout, replayed after re-planning a different random layout of the same rung (checked), then
timed on the full layout (median of many replays of one layer's call). Errors are
||out - ref|| / ||ref|| against RaggedTorch/PagedTorch on fp32 copies of the same bf16 inputs;
paged steps also check that the appended K/V landed where PagedTorch puts them. Workspace bytes
FlashInfer's planner reserves are set against resources/flashinfer_sizes.py's formulas.
A combination FlashInfer (or the backend) refuses is recorded with its error, not raised.
Kernels are compiled first, in parallel child processes. Writes $OUT/attention_gpu.json when OUT
is set; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from graphc.units import MiB, ceil_div, round_up  # noqa: E402
from resources import flashinfer_sizes as fis  # noqa: E402
from resources.base import StepShape  # noqa: E402
from resources.capabilities import available, run_head_dim  # noqa: E402
from resources.flashinfer_backend import make_backend, paged_plan, ragged_indptrs  # noqa: E402
from resources.paged_kv import PagedKVSpec, PagedTorch, new_cache  # noqa: E402
from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch  # noqa: E402

TOL = 2e-2      # bf16 attention against fp32 SDPA lands at a few 1e-3
LAYER = 1       # paged steps use the pool's second layer, so the layer index is exercised
ARCH = "sm_90"
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


@dataclass(frozen=True)
class Case:
    name: str
    spec: RaggedAttentionSpec | PagedKVSpec
    rung: StepShape       # the captured rung; its full layout is the timed one


def qwen3_omni_cases() -> list[Case]:
    audio = RaggedAttentionSpec(name="audio_attn", num_heads=20, head_dim=64, max_segment=104)
    vision = RaggedAttentionSpec(name="vision_attn", num_heads=16, head_dim=72, max_segment=1024)
    code2wav = RaggedAttentionSpec(name="code2wav_attn", num_heads=16, head_dim=64, max_segment=300,
                                   causal=True, window=72)
    thinker = PagedKVSpec(name="thinker_kv", num_layers=2, num_qo_heads=32, num_kv_heads=4, head_dim=128,
                          max_seq_len=2048)
    talker = PagedKVSpec(name="talker_kv", num_layers=2, num_qo_heads=16, num_kv_heads=2, head_dim=128,
                         max_seq_len=1024)
    return [
        Case("audio", audio, StepShape(rows=8 * 104, seqs=8, kv_len=104)),              # 8 windows of 104
        Case("vision", vision, StepShape(rows=4 * 1024, seqs=4, kv_len=1024)),          # 4 frames of 1024 patches
        Case("code2wav", code2wav, StepShape(rows=4 * 300, seqs=4, kv_len=300)),        # 4 chunks of 300
        Case("thinker_prefill", thinker, StepShape(rows=1024, seqs=2, kv_len=2048)),    # 2 x 1024 in 2 chunks
        Case("thinker_decode", thinker, StepShape(rows=64, seqs=64, kv_len=2048, phase="decode")),
        Case("talker_prefill", talker, StepShape(rows=512, seqs=2, kv_len=1024)),       # 2 x 512 in 2 chunks
        Case("talker_decode", talker, StepShape(rows=32, seqs=32, kv_len=1024, phase="decode")),
    ]


# ---------------------------------------------------------------- layouts and inputs

def cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def segments(rng: random.Random, case: Case, full: bool) -> list[int]:
    """cu_seqlens of the rung: every segment at max_segment, or a random count of random lengths."""
    seqs, most = case.rung.seqs, case.spec.max_segment
    if full:
        return cumsum([most] * seqs)
    # under a causal mask the padding rows take a segment of their own (ragged_indptrs): leave one
    n = rng.randint(1, max(1, seqs - case.spec.causal))
    return cumsum([rng.randint(max(1, most // 4), most) for _ in range(n)])


def paged_layout(rng: random.Random, case: Case, full: bool) -> tuple[list[int], list[int]]:
    """(qo_lens, kv_lens) of the rung. Full: a second prefill chunk as long as the first, or every
    decode row at kv_len. Otherwise rows split at random and random earlier tokens."""
    r = case.rung
    if r.phase == "decode":
        return [1] * r.seqs, [r.kv_len if full else rng.randint(1, r.kv_len) for _ in range(r.seqs)]
    if full:
        chunk = r.rows // r.seqs
        return [chunk] * r.seqs, [2 * chunk] * r.seqs
    cuts = sorted(rng.sample(range(1, r.rows), r.seqs - 1))
    qo = [b - a for a, b in zip([0] + cuts, cuts + [r.rows])]
    return qo, [q + rng.randint(0, r.kv_len - q) for q in qo]


def page_tables(rng: random.Random, case: Case, kv_lens: list[int]) -> list[list[int]]:
    """Scattered pages, as a long-running pool hands them out."""
    need = [case.spec.pages_for(kv) for kv in kv_lens]
    pages = rng.sample(range(pool_pages(case)), sum(need))
    bounds = cumsum(need)
    return [pages[a:b] for a, b in zip(bounds, bounds[1:])]


def pool_pages(case: Case) -> int:
    return case.rung.seqs * case.spec.pages_for(case.rung.kv_len)


def new_pool(case: Case) -> torch.Tensor:
    """[layers, pages, 2, page, Hkv, D] bf16 of random values: every position holds some history."""
    return new_cache(case.spec, pool_pages(case), "cuda").normal_()


def qkv(case: Case, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = case.spec
    hq, hkv = (s.num_heads, s.kv_heads) if s.kind == "ragged_attention" else (s.num_qo_heads, s.num_kv_heads)
    n = case.rung.rows if rows is None else rows
    return tuple(torch.randn(n, h, s.head_dim, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))


def refill(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t.normal_()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def replan(backend, *layout) -> None:
    # FlashInfer stages each plan in pinned host memory: let the last plan's copies land first
    torch.cuda.synchronize()
    backend.plan(*layout)


def capture(fn):
    """fn in a CUDA graph, after one eager call on a side stream (FlashInfer caches small device
    buffers on first use, which must not be allocated inside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_replays(graph: torch.cuda.CUDAGraph, n: int) -> float:
    """Median µs of one replay (one layer's call), each between CUDA events; inputs stay in L2."""
    graph.replay()
    torch.cuda.synchronize()
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in marks:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in marks) * 1000


# ---------------------------------------------------------------- ragged

def ragged_error(case: Case, cu: list[int], out, q, k, v) -> float:
    ref = RaggedTorch(case.spec, cu)(q.float(), k.float(), v.float())
    return rel_err(out[:cu[-1]], ref[:cu[-1]])


def ragged_eager(case: Case, backend: str, workspace: torch.Tensor, rng: random.Random) -> dict:
    b = make_backend(case.spec, backend, workspace, False, case.rung, run_head_dim=run_dim(case, backend))
    cu = segments(rng, case, full=False)
    q, k, v = qkv(case)          # rung-sized: rows past cu[-1] are padding, as a runtime passes them
    replan(b, cu)
    return {"rel_err": ragged_error(case, cu, b(q, k, v), q, k, v), "layout": cu}


def ragged_captured(case: Case, backend: str, workspace: torch.Tensor, rng: random.Random, replays: int) -> dict:
    b = make_backend(case.spec, backend, workspace, True, case.rung, run_head_dim=run_dim(case, backend))
    full, other = segments(rng, case, full=True), segments(rng, case, full=False)
    q, k, v = qkv(case)
    replan(b, full)
    graph, out = capture(lambda: b(q, k, v))
    refill(q, k, v)
    replan(b, other)
    graph.replay()
    err = ragged_error(case, other, out, q, k, v)
    replan(b, full)
    return {"rel_err": err, "us_per_call": time_replays(graph, replays), "layout": other}


# ---------------------------------------------------------------- paged

def paged_step(case: Case, b, cache: torch.Tensor, qo: list[int], kv: list[int], tables) -> tuple[float, bool]:
    """One eager step against PagedTorch on an fp32 copy of the layer; (error, append exact)."""
    q, k, v = qkv(case, sum(qo))
    ref_cache = cache[LAYER:LAYER + 1].float()
    ref = PagedTorch(case.spec.model_copy(update={"dtype": "float32"}), ref_cache, qo, kv, tables)(
        0, q.float(), k.float(), v.float())
    replan(b, qo, kv, tables)
    out = b(LAYER, q, k, v)
    return rel_err(out, ref), torch.equal(cache[LAYER].float(), ref_cache[0])


def paged_eager(case: Case, backend: str, workspace: torch.Tensor, rng: random.Random) -> dict:
    """Prefill: two chunks of the same sequences, the second attending to the keys the first
    appended; decode: one step on a random layout."""
    r, cache = case.rung, new_pool(case)
    b = make_backend(case.spec, backend, workspace, False, r, cache=cache)
    if r.phase == "decode":
        steps = [paged_layout(rng, case, full=False)]
    else:
        chunk = r.rows // r.seqs
        steps = [([chunk] * r.seqs, [chunk] * r.seqs), ([chunk] * r.seqs, [2 * chunk] * r.seqs)]
    tables = page_tables(rng, case, steps[-1][1])
    results = [paged_step(case, b, cache, qo, kv, tables) for qo, kv in steps]
    return {"rel_err": max(e for e, _ in results), "append_exact": all(ok for _, ok in results),
            "layout": steps}


def paged_captured(case: Case, backend: str, workspace: torch.Tensor, rng: random.Random, replays: int) -> dict:
    cache = new_pool(case)
    b = make_backend(case.spec, backend, workspace, True, case.rung, cache=cache)
    full, other = paged_layout(rng, case, full=True), paged_layout(rng, case, full=False)
    full_tables, other_tables = page_tables(rng, case, full[1]), page_tables(rng, case, other[1])
    q, k, v = qkv(case)
    replan(b, *full, full_tables)
    graph, out = capture(lambda: b(LAYER, q, k, v))
    refill(q, k, v)
    ref_cache = cache[LAYER:LAYER + 1].float()
    ref = PagedTorch(case.spec.model_copy(update={"dtype": "float32"}), ref_cache, *other, other_tables)(
        0, q.float(), k.float(), v.float())
    replan(b, *other, other_tables)
    graph.replay()
    err, exact = rel_err(out, ref), torch.equal(cache[LAYER].float(), ref_cache[0])
    replan(b, *full, full_tables)
    return {"rel_err": err, "append_exact": exact, "us_per_call": time_replays(graph, replays),
            "layout": [*other]}


# ---------------------------------------------------------------- workspace

def module_args(backend: str, head_dim: int, sliding: bool) -> tuple:
    """What FlashInfer compiles and caches one prefill module on: q/kv/o dtypes, index dtype, qk/vo
    head dims, position encoding (NONE), sliding window, logits soft cap, fp16 qk reduction."""
    bf16 = torch.bfloat16
    return (backend, bf16, bf16, bf16, torch.int32, head_dim, head_dim, 0, sliding, False, False)


def run_dim(case: Case, backend: str) -> int:
    """The head dim the backend's kernels run this case at: ragged head dims a kernel lacks run
    zero-padded (resources/capabilities.run_head_dim); a paged cache keeps its own."""
    d = case.spec.head_dim
    return (run_head_dim(backend, d) or d) if case.spec.kind == "ragged_attention" else d


def module_key(case: Case, backend: str) -> tuple:
    return backend, run_dim(case, backend), getattr(case.spec, "window", None) is not None


def planner_inputs(case: Case, rng: random.Random) -> dict:
    """The host arrays FlashInfer's planner sizes the rung's full layout from (decode rows run on
    the tensor-core prefill planner: every case here has a GQA group of 8)."""
    s, r = case.spec, case.rung
    if s.kind == "ragged_attention":
        cu = segments(rng, case, full=True)
        qo, kv = ragged_indptrs(cu, cu, r, s.causal)
        return dict(qo=qo, kv_indptr=kv, kv_lens=[b - a for a, b in zip(kv, kv[1:])], hq=s.num_heads,
                    hkv=s.kv_heads, page_size=1, causal=s.causal, window_left=s.window - 1 if s.window else -1)
    qo_lens, kv_lens = paged_layout(rng, case, full=True)
    p = paged_plan(qo_lens, kv_lens, page_tables(rng, case, kv_lens), s.page_size)
    return dict(qo=p.qo_indptr, kv_indptr=p.kv_indptr, kv_lens=kv_lens, hq=s.num_qo_heads, hkv=s.num_kv_heads,
                page_size=s.page_size, causal=r.phase != "decode", window_left=-1)


def measured_workspace(case: Case, backend: str, rng: random.Random) -> tuple[int, int] | None:
    """(float, int) bytes the captured plan of the full layout reserves, from FlashInfer's own
    workspace_size; None where the module has none (fa3: its SM90 planner keeps nothing in the
    float workspace)."""
    from flashinfer.prefill import get_batch_prefill_module

    module = get_batch_prefill_module(*module_args(*module_key(case, backend)))
    if module.workspace_size is None:
        return None
    a, d = planner_inputs(case, rng), case.spec.head_dim
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    sizes = module.workspace_size(torch.empty(16, dtype=torch.uint8, device="cuda"), i32(a["qo"]),
                                  i32(a["kv_indptr"]), i32(a["kv_lens"]), a["qo"][-1], len(a["qo"]) - 1, a["hq"],
                                  a["hkv"], a["page_size"], True, d, d, a["causal"], a["window_left"], -1, False, 0, 0)
    return int(sizes[0]), int(sizes[1])


def formula_int_need(case: Case, num_sms: int) -> int:
    """flashinfer_sizes.int_workspace_need at the rung, with the padded tile count of its float formula."""
    s, r = case.spec, case.rung
    hq, hkv = (s.num_heads, s.kv_heads) if s.kind == "ragged_attention" else (s.num_qo_heads, s.num_kv_heads)
    gqa = hq // hkv
    tile = fis.fa2_cta_tile_q((r.rows - r.seqs + 1) * gqa, s.head_dim)
    padded = max(fis.PREFILL_BLOCKS_PER_SM * num_sms // hkv, ceil_div(r.rows * gqa, tile) + r.seqs - 1)
    return fis.int_workspace_need(r.rows, r.seqs, padded)


def workspace_record(case: Case, backend: str, rng: random.Random, num_sms: int) -> dict:
    formula = case.spec.float_workspace(backend, case.rung, num_sms)
    rec = {"float_formula": formula.bytes, "formula": formula.formula,
           "int_capacity": case.spec.int_workspace_bytes, "int_formula_need": formula_int_need(case, num_sms)}
    used = measured_workspace(case, backend, rng) if backend in ("fa2", "fa3") else None
    if used is None:
        rec["note"] = (f"{backend}: FlashInfer reports no workspace size" +
                       ("; its SM90 planner allocates no float workspace" if backend == "fa3" else ""))
        rec["float_used"] = 0 if backend == "fa3" else None
        return rec
    rec["float_used"], rec["int_used"] = used
    rec["formula_covers"] = formula.bytes >= used[0]
    return rec


# ---------------------------------------------------------------- one combination

def error_text(e: BaseException) -> str:
    """The message, or for a compiler's log its error lines."""
    text = f"{type(e).__name__}: {e}"
    if len(text) <= 800:
        return text
    errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    return "\n".join(errors[:6])[:1500] if errors else text[-800:]


def attempt(fn, *args) -> dict:
    try:
        result = fn(*args)
        torch.cuda.synchronize()
        return {"status": "ok", **result}
    except Exception as e:  # a refusal is a result: record it and go on
        return {"status": "refused", "error": error_text(e)}


def run_case(case: Case, backend: str, workspace: torch.Tensor, replays: int = 50,
             build_error: str | None = None) -> dict:
    """Eager and captured runs of one (shape, backend), its workspace, and a status."""
    rec = {"case": case.name, "kind": case.spec.kind, "backend": backend, "rung": asdict(case.rung),
           "spec": case.spec.model_dump()}
    if build_error is not None:
        refused = {"status": "refused", "error": build_error}
        return {**rec, "eager": refused, "captured": refused, "status": "refused"}
    rng = random.Random(f"{case.name}/{backend}")
    ragged = case.spec.kind == "ragged_attention"
    rec["eager"] = attempt(ragged_eager if ragged else paged_eager, case, backend, workspace, rng)
    rec["captured"] = attempt(ragged_captured if ragged else paged_captured, case, backend, workspace, rng, replays)
    if rec["captured"]["status"] == "ok":
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        rec["workspace"] = attempt(workspace_record, case, backend, rng, sms)
    rec["status"] = status(rec)
    torch.cuda.empty_cache()
    return rec


def status(rec: dict) -> str:
    runs = [rec["eager"], rec["captured"]]
    if any(r["status"] != "ok" for r in runs):
        return "refused"
    good = all(r["rel_err"] < TOL and r.get("append_exact", True) for r in runs)
    return "ok" if good else "mismatch"


# ---------------------------------------------------------------- kernel builds

def needed_modules(cases: list[Case], backends: dict[str, list[str]]) -> list[tuple]:
    """FlashInfer JIT modules the runs load: one prefill module per (backend, head_dim, window),
    shared by ragged, paged and tensor-core decode; the page module for appends."""
    from flashinfer.utils import is_fa3_prefill_head_dim_supported

    keys = set()
    for case in cases:
        for backend in backends[case.name]:
            d = run_dim(case, backend)
            if backend == "fa2" or (backend == "fa3" and is_fa3_prefill_head_dim_supported(d, d)):
                keys.add(module_key(case, backend))
        if case.spec.kind == "paged_kv":
            keys.add(("page",))
    return sorted(keys)


def build_worker(keys_json: str) -> None:
    """Child process: compile each module (or find it built); {key: error or None} as the last line."""
    from flashinfer.page import get_page_module
    from flashinfer.prefill import get_batch_prefill_module

    results = {}
    for key in json.loads(keys_json):
        start = time.perf_counter()
        try:
            get_page_module() if key[0] == "page" else get_batch_prefill_module(*module_args(*key))
            results[json.dumps(key)] = None
        except Exception as e:
            results[json.dumps(key)] = error_text(e)
        print(f"  built {key} in {time.perf_counter() - start:.0f} s"
              f"{' (failed)' if results[json.dumps(key)] else ''}", file=sys.stderr, flush=True)
    print(json.dumps(results))


def lanes_of(keys: list[tuple], lanes: int) -> list[list[tuple]]:
    """Heaviest first onto the lightest lane (an fa3 module compiles about 3x longer than fa2)."""
    weight = {"fa3": 3.0, "fa2": 1.0, "page": 0.5}
    out = [[] for _ in range(lanes)]
    load = [0.0] * lanes
    for key in sorted(keys, key=lambda k: -weight[k[0]]):
        i = load.index(min(load))
        out[i].append(key)
        load[i] += weight[key[0]]
    return [lane for lane in out if lane]


def prebuild(keys: list[tuple], lanes: int) -> dict[tuple, str | None]:
    """Compile the modules in parallel child processes (ninja jobs split between them, so nvcc's
    memory stays bounded); returns each key's build error or None."""
    groups = lanes_of(keys, lanes)
    jobs = max(1, (os.cpu_count() or 2) // max(1, len(groups)))
    env = {**os.environ, "MAX_JOBS": str(jobs)}
    procs = [(group, subprocess.Popen([sys.executable, __file__, "--build", json.dumps(group)],
                                      stdout=subprocess.PIPE, text=True, env=env)) for group in groups]
    errors = {}
    for group, proc in procs:
        out, _ = proc.communicate()
        report = last_json(out) if proc.returncode == 0 else None
        if report is None:
            errors |= {key: f"build worker exited with {proc.returncode}" for key in group}
        else:
            errors |= {tuple(json.loads(k)): v for k, v in report.items()}
    return errors


def last_json(text: str) -> dict | None:
    """The worker's report: its last line that is JSON (a library may print before it)."""
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def case_build_error(case: Case, backend: str, build_errors: dict[tuple, str | None]) -> str | None:
    """A failed build of a module the combination loads, so it is not compiled (and failed) again."""
    keys = [module_key(case, backend)] + ([("page",)] if case.spec.kind == "paged_kv" else [])
    return next((build_errors[k] for k in keys if build_errors.get(k)), None)


# ---------------------------------------------------------------- report

def table(results: list[dict]) -> str:
    def err(run: dict) -> str:
        return f"{run['rel_err']:.1e}" if run["status"] == "ok" else "-"

    def mib(n) -> str:
        return "-" if n is None else f"{n / MiB:.1f}"

    lines = [f"{'case':<16} {'backend':<7} {'status':<8} {'eager':>8} {'graph':>8} {'us/call':>8} "
             f"{'float MiB used/formula':>23}  error"]
    for r in results:
        ws = r.get("workspace", {})
        used = f"{mib(ws.get('float_used'))}/{mib(ws.get('float_formula'))}" if ws.get("status") == "ok" else "-"
        us = r["captured"].get("us_per_call")
        why = next((run["error"].splitlines()[0][:70] for run in (r["eager"], r["captured"]) if "error" in run), "")
        lines.append(f"{r['case']:<16} {r['backend']:<7} {r['status']:<8} {err(r['eager']):>8} "
                     f"{err(r['captured']):>8} {('-' if us is None else f'{us:.1f}'):>8} {used:>23}  {why}")
    return "\n".join(lines)


def environment() -> dict:
    import importlib.util

    import flashinfer

    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "num_sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "flashinfer": flashinfer.__version__,
            "cudnn_frontend": importlib.util.find_spec("cudnn") is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--backends", help=f"comma-separated backends (default: the {ARCH} capability table's)")
    ap.add_argument("--replays", type=int, default=50, help="graph replays per timing")
    ap.add_argument("--lanes", type=int, default=2, help="kernel builds run at once")
    ap.add_argument("--build", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        return build_worker(args.build)

    cases = [c for c in qwen3_omni_cases() if not args.cases or c.name in args.cases.split(",")]
    wanted = args.backends.split(",") if args.backends else None
    backends = {c.name: [b for b in available(c.spec.kind, ARCH) if not wanted or b in wanted] for c in cases}
    torch.manual_seed(0)
    env = environment()
    log(f"{env['device']}, {env['num_sms']} SMs, torch {env['torch']}, flashinfer {env['flashinfer']}")
    keys = needed_modules(cases, backends)
    log(f"compiling {len(keys)} FlashInfer modules in {args.lanes} lanes: {keys}")
    build_errors = prebuild(keys, args.lanes)
    log(f"built; failed: {[k for k, e in build_errors.items() if e] or 'none'}")

    # one float workspace for everything, as large as the compiler's formula asks at any rung
    need = max((c.spec.float_workspace(b, c.rung, env["num_sms"]).bytes for c in cases for b in backends[c.name]),
               default=0)
    workspace = torch.zeros(max(round_up(need, MiB), MiB), dtype=torch.uint8, device="cuda")
    log(f"float workspace {workspace.numel() / MiB:.0f} MiB")

    results = []
    for case in cases:
        for backend in backends[case.name]:
            rec = run_case(case, backend, workspace, args.replays, case_build_error(case, backend, build_errors))
            results.append(rec)
            log(f"{case.name} {backend}: {rec['status']}")

    report = {"env": env, "tolerance": TOL, "float_workspace_bytes": workspace.numel(),
              "builds": {json.dumps(k): e for k, e in build_errors.items()}, "results": results,
              "wall_s": time.perf_counter() - T0}
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "attention_gpu.json"
        path.write_text(json.dumps(report, indent=1, default=str))
        log(f"wrote {path}")
    print(table(results))


if __name__ == "__main__":
    main()
