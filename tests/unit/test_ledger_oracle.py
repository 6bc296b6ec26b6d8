"""An independent oracle for the ledger: every line of a small model's plan, computed by hand.

The model (tests/oracle_model.py) is one node whose forward allocates a few large, obvious tensors,
on one paged KV pool with a declared two-slot workspace. Nothing here calls the compiler's
arithmetic: the allocation sequences are written out, the caching allocator is re-modelled below
from c10's rules, and the constants come from the declaration, the target's published memory
and graphc/calibration.yaml. Each assertion says what the hand computation was.

Walks (one node `mlp`, capture axis tokens, or seqs on decode):
    prefill  budget tokens=24 seqs=2, ladder (8,)       -> rungs [8, 24], all captured
    mixed    budget tokens=32 seqs=2, ladder (8, 16),    -> rungs [8, 16, 32], captured [8, 16];
             capture_limit 16                               steps of 17..32 tokens run eagerly at 32
    decode   budget seqs=4, default ladder               -> rungs [1, 2, 4], all captured
The h100 plans decode on FlashInfer's fa2 (asked for, FA2: the hand sums count its wrappers' buffers); sm_90's
own choice, the one-launch Triton decode, has a test of its own (test_triton_decode_wrappers).
prefill and mixed are one graph family (prefill:tokens): it captures the union [8, 16, 24] (24 only
from prefill, 16 only from mixed) and its static buffers are sized at 24; decode:seqs captures
[1, 2, 4], buffers at 4.

One step of T rows (T = tokens, or seqs on decode; F = 2**20) allocates, in this order:
    alloc h  2*T*F      (up: x [T, 64] @ [64, F], bf16)
    alloc g  2*T*F      (gelu)
    free  h
    alloc y  1024*T     (down: [T, F] @ [F, 512], bf16)
    free  g
    alloc o0 1024*T     (the layer-0 attention call returns a new [T, 8, 64] bf16)
    free  y
    alloc o1 1024*T     (layer 1)
    free  o0
    free  o1            (the output, once the caller has copied it out)
so its peak is h + g = 4*T*F B and it launches 5 kernels (mm, gelu, mm, two attention calls).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from graphc.pipeline import compile_model
from graphc.source import load_model
from tests import oracle_model as om

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests" / "oracle_model.py")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
F = om.FFN                                        # 2**20
BF16, FP32, I32 = 2, 4, 4

# ------------------------------------------------------------------ the declaration, by hand

FA2 = {"resources": {"cache": {"decode_backend": "fa2"}}}
H100_BYTES = 85_017_493_504                       # torch's total on an H100 SXM 80GB HBM3 (measured)
CPU_BYTES = 8 * GiB                               # the cpu target's default host budget
GPU_GRAPHS = [("prefill:tokens", 8), ("prefill:tokens", 16), ("prefill:tokens", 24),
              ("decode:seqs", 1), ("decode:seqs", 2), ("decode:seqs", 4)]


def round_to(n: int, align: int) -> int:
    return -(-n // align) * align


# weights: up [F, 64], down [512, F], scale [100] (all bf16) and offsets [3] (a float32 buffer),
# each tensor aligned to 256 B in one arena
NUM_PARAMS = 64 * F + F * 512 + 100
PARAM_BYTES = BF16 * NUM_PARAMS
ARENA = round_to(64 * F * BF16, 256) + round_to(F * 512 * BF16, 256) + round_to(100 * BF16, 256) \
    + round_to(3 * FP32, 256)
ARENA_WHY = "64xF + Fx512 bf16 (already 256-B multiples) + scale 100 bf16 = 200 -> 256 + offsets 3 fp32 = 12 -> 256"

# one page: K and V x 2 layers x 16 tokens x 1 kv head x 64 dims x 2 B
PAGE_BYTES = 2 * om.LAYERS * om.PAGE_SIZE * 1 * om.HEAD_DIM * BF16
PAGES_PER_REQUEST = -(-om.MAX_SEQ_LEN // om.PAGE_SIZE)          # 1024 / 16 = 64

WORKSPACE = 2 * om.WORKSPACE_BYTES                               # declared 16 MiB x 2 slots

# static buffers: x [T, 64] and y [T, 512] bf16 at each family's largest rung
GRAPH_IO = [("prefill:tokens in.x", 24 * 64 * BF16), ("prefill:tokens out.y", 24 * 512 * BF16),
            ("decode:seqs in.x", 4 * 64 * BF16), ("decode:seqs out.y", 4 * 512 * BF16)]

INT_WORKSPACE = 8 * MiB            # FlashInfer's default int workspace: one a resource, its captured wrappers share it
KV_LENS = 32768 * I32              # the paged prefill wrapper's own kv_lens buffer
TRANSIENT = 8 * MiB                # the int workspace FlashInfer builds and ours replaces; stays cached


def wrapper_buffers(family: str, rung: int, family_seqs: int = 2, decode_qo_indptr: bool = True,
                    int_workspace: bool = False) -> list:
    """The fixed buffers one captured paged wrapper holds at a rung (resources/flashinfer_backend.py
    graph_buffers, plus what FlashInfer's wrapper allocates itself); int_workspace: the resource's one int
    workspace too (its first captured wrapper's: the runtime makes it then and the others share it)."""
    if family.startswith("decode"):
        seqs = rows = rung                       # one row per sequence
    else:
        rows, seqs = rung, min(family_seqs, rung)
    bufs = [("int_workspace", INT_WORKSPACE)] if int_workspace else []
    bufs += [("kv_indptr", I32 * (seqs + 1)),
            ("kv_indices", I32 * seqs * PAGES_PER_REQUEST), ("kv_last_page_len", I32 * seqs),
            ("append_indices", I32 * 2 * rows)]
    if family.startswith("prefill"):
        bufs += [("qo_indptr", I32 * (seqs + 1)), ("kv_lens", KV_LENS)]
    elif decode_qo_indptr:       # the tensor-core decode wrapper keeps its own arange(seqs + 1)
        bufs += [("qo_indptr", I32 * (seqs + 1))]
    return bufs


def step_events(rows: int) -> list[tuple[str, str, int]]:
    """The module docstring's allocation sequence of one step of `rows` rows."""
    act, out = 2 * rows * F, 1024 * rows
    return [("alloc", "h", act), ("alloc", "g", act), ("free", "h", act), ("alloc", "y", out), ("free", "g", act),
            ("alloc", "o0", out), ("free", "y", out), ("alloc", "o1", out), ("free", "o0", out), ("free", "o1", out)]


def peak(rows: int) -> int:
    return 4 * rows * F                          # h and g live together


LAUNCHES_PER_STEP = 5                            # mm, gelu, mm, attention x 2

# ------------------------------------------------------------------ c10's caching allocator, re-modelled

SMALL_REQUEST = 1 * MiB       # requests up to 1 MiB are served from the small pool


class Pool:
    """One pool of PyTorch's CUDA caching allocator with default settings (c10/cuda/
    CUDACachingAllocator.cpp): sizes round up to 512 B; requests <= 1 MiB come from 2 MiB
    segments, 1-10 MiB from 20 MiB segments, larger ones from a segment of their size rounded up
    to 2 MiB; the smallest free block of the request's pool that fits is reused (best fit), split
    when what remains is >= 512 B (small pool) or > 1 MiB (large pool); freed blocks merge with
    free neighbours; segments are never released."""

    def __init__(self) -> None:
        self.segments: list[tuple[bool, list[list]]] = []   # (small, blocks [size, owner or None])
        self.owner_segment: dict[str, int] = {}

    @property
    def reserved(self) -> int:
        return sum(size for _, blocks in self.segments for size, _ in blocks)

    def malloc(self, owner: str, nbytes: int) -> None:
        size = max(512, round_to(nbytes, 512))
        small = size <= SMALL_REQUEST
        fits = [(blocks[i][0], s, i) for s, (is_small, blocks) in enumerate(self.segments) if is_small == small
                for i in range(len(blocks)) if blocks[i][1] is None and blocks[i][0] >= size]
        if fits:
            _, s, i = min(fits)
        else:
            segment = 2 * MiB if small else 20 * MiB if size < 10 * MiB else round_to(size, 2 * MiB)
            self.segments.append((small, [[segment, None]]))
            s, i = len(self.segments) - 1, 0
        blocks = self.segments[s][1]
        rest = blocks[i][0] - size
        if rest >= 512 if small else rest > SMALL_REQUEST:
            blocks[i:i + 1] = [[size, owner], [rest, None]]
        else:
            blocks[i][1] = owner
        self.owner_segment[owner] = s

    def free(self, owner: str) -> None:
        blocks = self.segments[self.owner_segment.pop(owner)][1]
        i = next(i for i, b in enumerate(blocks) if b[1] == owner)
        blocks[i][1] = None
        if i + 1 < len(blocks) and blocks[i + 1][1] is None:
            blocks[i][0] += blocks.pop(i + 1)[0]
        if i > 0 and blocks[i - 1][1] is None:
            blocks[i - 1][0] += blocks.pop(i)[0]

    def step(self, tag: str, rows: int) -> None:
        for kind, name, n in step_events(rows):
            self.malloc(f"{tag}.{name}", n) if kind == "alloc" else self.free(f"{tag}.{name}")


def test_the_allocator_model_itself():
    """The re-model against cases worked on paper, so the oracle's own arithmetic is trusted."""
    p = Pool()
    p.malloc("a", 100)                            # a 2 MiB small segment
    p.malloc("b", 3 * MiB)                        # 1-10 MiB: a 20 MiB segment, split 3 + 17
    p.malloc("c", 8 * MiB)                        # the 17 MiB tail holds it: 3 + 8 + 9
    p.malloc("d", 10 * MiB + 1)                   # >= 10 MiB: its own segment, 10 MiB + 512 -> 12 MiB
    assert p.reserved == (2 + 20 + 12) * MiB
    p.free("b")
    p.free("c")                                   # 3 + 8 + 9 merge back into 20 free
    p.malloc("e", 19 * MiB)                       # fits the merged block: no growth
    assert p.reserved == 34 * MiB
    p.malloc("f", 2 * MiB)                        # e took all 20 MiB (a 1 MiB rest is not split off) and d's
    assert p.reserved == 54 * MiB                 # tail is 2 MiB - 512: a new 20 MiB segment
    p.malloc("g", MiB + 512)                      # d's 2 MiB - 512 tail holds it (large pool, best fit)
    assert p.reserved == 54 * MiB


# ------------------------------------------------------------------ the plans

@pytest.fixture(scope="module")
def source():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def gpu(source):
    compiled = compile_model(source, "h100", 1, FA2)
    return compiled.plan, compiled.plan.devices[0]


@pytest.fixture(scope="module")
def cpu(source):
    compiled = compile_model(source, "cpu")
    return compiled.plan, compiled.plan.devices[0]


def calibration(arch: str) -> dict:
    return yaml.safe_load((ROOT / "graphc" / "calibration.yaml").read_text())["entries"][arch]


def expect(got: int, want: int, what: str, how: str) -> None:
    assert got == want, f"{what}: the plan says {got:,} B but by hand it is {want:,} B ({got - want:+,}):\n  {how}"


# ------------------------------------------------------------------ GPU: buckets, order, eager steps

def test_captured_rungs_merge_a_family(gpu):
    plan, _ = gpu
    node = plan.nodes["mlp"]
    want = {"prefill:tokens": [8, 16, 24], "decode:seqs": [1, 2, 4]}
    assert node.graphs == want, (
        f"captured rungs per family: plan {node.graphs}, by hand {want}: prefill (budget 24, ladder 8) captures "
        "[8, 24] and mixed (budget 32, ladder 8,16, capture_limit 16: rungs up to and including 16) captures "
        "[8, 16]; one family captures the UNION of its walks' rungs, whichever walk comes last; decode (budget 4, "
        "default ladder) captures [1, 2, 4]")
    b = node.buckets
    rows = {w: (b[w].rungs, b[w].captured, b[w].eager_above) for w in b}
    want_rows = {"prefill": ([8, 24], [8, 24], None), "mixed": ([8, 16, 32], [8, 16], 16),
                 "decode": ([1, 2, 4], [1, 2, 4], None)}
    assert rows == want_rows, (
        f"(rungs, captured, eager_above) per walk: plan {rows}, by hand {want_rows}: the ladder's rungs below the "
        "budget then the budget; mixed captures up to its capture_limit 16 and runs 17..32 eagerly; no other walk "
        "has an eager step")


def test_capture_order_is_largest_peak_first(gpu):
    _, dev = gpu
    want = [f"mlp/{fam}/{r}" for fam, r in sorted(GPU_GRAPHS, key=lambda g: -peak(g[1]))]
    peaks = ", ".join(f"{fam}@{r}: {peak(r) // MiB} MiB" for fam, r in sorted(GPU_GRAPHS, key=lambda g: -peak(g[1])))
    assert dev.capture_order == want, (
        f"capture order: plan {dev.capture_order}, by hand {want}: largest simulated peak first, the peak of a "
        f"step of T rows being h + g = 4*T*F B ({peaks})")


def test_eager_steps(gpu):
    _, dev = gpu
    named = re.findall(r"\bmlp@\w+", dev.sources["activations"])
    assert named == ["mlp@mixed"], (
        f"eager steps: the activations line names {named} ('{dev.sources['activations']}'); by hand exactly one, "
        "mlp on mixed at its budget 32 (captured only up to 16)")


# ------------------------------------------------------------------ GPU: the exact and formula lines

def test_weights(gpu):
    plan, dev = gpu
    assert plan.nodes["mlp"].num_params == NUM_PARAMS, (
        f"parameters: plan {plan.nodes['mlp'].num_params:,}, by hand 64*F + F*512 + 100 = {NUM_PARAMS:,}")
    expect(plan.nodes["mlp"].weights_bytes, PARAM_BYTES, "weights_bytes", f"2 B x {NUM_PARAMS:,} bf16 parameters")
    expect(dev.ledger["weights.mlp"], ARENA, "weights.mlp (one arena)", ARENA_WHY)


def test_page_bytes(gpu):
    plan, _ = gpu
    expect(plan.resources["cache"].page_bytes, PAGE_BYTES, "cache page_bytes",
           "2 (K, V) x 2 layers x 16 tokens x 1 kv head x 64 dims x 2 B = 8192")


def test_workspace(gpu):
    _, dev = gpu
    expect(dev.ledger["workspace.ws"], WORKSPACE, "workspace.ws", "declared 16 MiB per slot x 2 slots")


def test_graph_io(gpu):
    _, dev = gpu
    expect(dev.ledger["graph_io.mlp"], sum(n for _, n in GRAPH_IO), "graph_io.mlp",
           "each family's static x [T, 64] and y [T, 512] bf16 at its LARGEST rung: prefill:tokens at 24: "
           "3,072 + 24,576; decode:seqs at 4: 512 + 4,096")


def test_wrappers(gpu):
    _, dev = gpu
    want = INT_WORKSPACE + sum(n for fam, r in GPU_GRAPHS for _, n in wrapper_buffers(fam, r))
    # one 8 MiB int workspace for the six graphs; prefill rungs 8/16/24 (2 seqs): qo 12 + kv_indptr 12 +
    # kv_indices 512 + last 8 + append 64/128/192 + kv_lens 131,072; decode rungs 1/2/4: 284 + 560 + 1,112
    assert want == INT_WORKSPACE + 3 * (12 + 12 + 512 + 8 + KV_LENS) + 8 * (8 + 16 + 24) + 284 + 560 + 1112
    expect(dev.ledger["wrappers.cache"], want, "wrappers.cache",
           "one 8 MiB int workspace the graphs share, and per captured graph int32 index buffers: prefill rungs (2 seqs): "
           "qo_indptr 4*3, kv_indptr 4*3, kv_indices 4*2*64 pages, kv_last_page_len 4*2, append_indices 4*2*T, "
           "kv_lens 32768*4; decode rungs (T seqs): kv_indptr 4*(T+1), kv_indices 4*T*64, last 4*T, append 4*2*T "
           "and the tensor-core wrapper's qo_indptr 4*(T+1)")


# ------------------------------------------------------------------ GPU: the simulated lines

def capture_pool() -> tuple[Pool, list[str]]:
    pool, log = Pool(), []
    pool.malloc("cublas", calibration("sm_90")["library_bytes"])      # the capture stream's own, first
    log.append(f"cuBLAS {pool.reserved // MiB} MiB")
    for fam, r in sorted(GPU_GRAPHS, key=lambda g: -peak(g[1])):
        before = pool.reserved
        pool.step(f"{fam}@{r}", r)
        log.append(f"{fam}@{r} +{(pool.reserved - before) // MiB} MiB")
    return pool, log


def test_capture_pool(gpu):
    _, dev = gpu
    pool, log = capture_pool()
    # by pencil: cuBLAS 32 MiB (a 2 MiB multiple >= 10 MiB: its own segment, never freed); prefill@24 takes
    # h 48 MiB and g 48 MiB (own segments) and y/o0/o1 24 KiB (one 2 MiB small segment); every later graph
    # is smaller and reuses those freed blocks
    assert pool.reserved == (32 + 48 + 48 + 2) * MiB
    expect(dev.ledger["capture_pool"], pool.reserved, "capture_pool",
           "one private pool: the capture stream's cuBLAS workspace first, then each graph's allocation sequence "
           f"replayed largest peak first through the caching allocator: {', '.join(log)}")


def persistent_allocations(pages: int) -> list[tuple[str, int]]:
    """What the runtime allocates on the general pool, in its order: arena, KV pool, workspace slots,
    static graph buffers, then each captured graph's wrapper buffers."""
    out = [("weights.mlp", ARENA)] + ([("kv.cache", pages * PAGE_BYTES)] if pages else [])
    out += [("ws.slot0", WORKSPACE // 2), ("ws.slot1", WORKSPACE // 2)]
    out += GRAPH_IO
    for i, (fam, r) in enumerate(sorted(GPU_GRAPHS, key=lambda g: -peak(g[1]))):   # the capture order
        out += [(f"{fam}@{r}.{name}", n) for name, n in wrapper_buffers(fam, r, int_workspace=i == 0)]
    return out


def general_pool(pages: int) -> tuple[int, int, int]:
    """(raw persistent bytes, reserved after them and the cached FlashInfer block, reserved after the
    eager step too)."""
    pool, raw = Pool(), 0
    for name, n in persistent_allocations(pages):
        pool.malloc(name, n)
        raw += n
    pool.malloc("flashinfer transient", TRANSIENT)
    persistent = pool.reserved
    pool.step("mixed@32", 32)
    return raw, persistent, pool.reserved


def test_activations(gpu):
    _, dev = gpu
    _, before, after = general_pool(dev.kv_pages["cache"])
    # by pencil: mixed@32 takes h and g of 64 MiB each; no free block of the general pool is that large
    # (the largest is the cached FlashInfer segment's 12 MiB tail), so two new 64 MiB segments; y/o0/o1
    # (32 KiB each) fit the small segment's free tail
    assert after - before == 128 * MiB
    expect(dev.ledger["activations"], after - before, "activations",
           "the eager step mlp@mixed at 32 tokens replayed on the general pool after the persistent allocations "
           "and FlashInfer's cached 8 MiB: h 64 MiB + g 64 MiB in new segments")


def test_allocator(gpu):
    _, dev = gpu
    raw, persistent, _ = general_pool(dev.kv_pages["cache"])
    small = sum(round_to(n, 512) for name, n in persistent_allocations(0) if 0 < n <= SMALL_REQUEST)
    # by pencil: the arena's segment is 1154 MiB for 1152 MiB + 512 B (tail 2 MiB - 512); the KV pool is a
    # whole number of 2 MiB (page count a multiple of 256) and the workspace slots are 16 MiB: no tails; the
    # small buffers (graph_io and wrapper indices, 441,344 B once rounded to 512) share one 2 MiB segment; the
    # one 8 MiB int workspace takes a 20 MiB segment, and FlashInfer's replaced 8 MiB, freed and kept cached,
    # fits its 12 MiB tail: the tail is the overhead
    assert small == 441_344
    pencil = (2 * MiB - 512) + (2 * MiB - sum(n for _, n in persistent_allocations(0) if 0 < n <= SMALL_REQUEST)) \
        + (20 * MiB - INT_WORKSPACE)
    assert persistent - raw == pencil
    expect(dev.ledger["allocator"], persistent - raw, "allocator",
           "reserved less requested over the persistent allocations: arena tail 2 MiB - 512 B, the small "
           "segment's unused part, and the 12 MiB tail of the int workspace's 20 MiB segment, where FlashInfer's "
           "replaced 8 MiB int workspace sits, kept cached")


# ------------------------------------------------------------------ GPU: calibrated and policy lines

def test_calibrated_lines(gpu):
    _, dev = gpu
    cal = calibration("sm_90")
    expect(dev.ledger["context"], cal["context_bytes"], "context", "calibration.yaml sm_90 context_bytes")
    expect(dev.ledger["library"], cal["library_bytes"], "library", "calibration.yaml sm_90 library_bytes (cuBLAS)")
    launches = LAUNCHES_PER_STEP * len(GPU_GRAPHS)
    expect(dev.ledger["kernels"], cal["kernels_base_bytes"] + cal["graph_launch_bytes"] * launches, "kernels",
           f"kernels_base_bytes {cal['kernels_base_bytes']:,} + graph_launch_bytes {cal['graph_launch_bytes']:,} x "
           f"{launches} launches (6 graphs x 5: mm, gelu, mm, two attention calls)")


def test_headroom(gpu):
    plan, dev = gpu
    expect(plan.target.capacity_bytes, H100_BYTES, "h100 capacity", "85,017,493,504 B as torch reports it")
    expect(dev.ledger["headroom"], H100_BYTES // 100, "headroom", "1% of the h100's total, the default policy")


def gpu_total(pages: int) -> int:
    """Every ledger line by hand for a KV pool of `pages` pages."""
    _, persistent, after = general_pool(pages)
    cal = calibration("sm_90")
    return (persistent + (after - persistent) + capture_pool()[0].reserved + cal["context_bytes"]
            + cal["library_bytes"] + cal["kernels_base_bytes"] + cal["graph_launch_bytes"] * 30 + H100_BYTES // 100)


def test_kv_pages_fill_the_gpu(gpu):
    _, dev = gpu
    # every line but the KV pool is fixed; the pool is one allocation of pages x 8192 B whose segment is
    # rounded to 2 MiB, so the largest pool that fits is the whole 2 MiB segments left, 256 pages each
    fixed = gpu_total(0)
    pages = (H100_BYTES - fixed) // (2 * MiB) * (2 * MiB // PAGE_BYTES)
    assert gpu_total(pages) <= H100_BYTES < gpu_total(pages + 1)      # the closed form is the largest that fits
    assert dev.kv_pages["cache"] == pages, (
        f"kv pages: plan {dev.kv_pages['cache']:,}, by hand {pages:,} = floor((capacity {H100_BYTES:,} - every "
        f"other line {fixed:,}) / 2 MiB segments) x 256 pages per segment")
    expect(dev.ledger["kv.cache"], pages * PAGE_BYTES, "kv.cache", f"{pages:,} pages x {PAGE_BYTES} B")


def test_ledger_has_every_line_and_adds_up(gpu):
    _, dev = gpu
    want = {"weights.mlp", "kv.cache", "workspace.ws", "graph_io.mlp", "wrappers.cache", "capture_pool",
            "activations", "allocator", "context", "library", "kernels", "headroom"}
    assert set(dev.ledger) == want, f"ledger lines: plan {sorted(dev.ledger)}, by hand {sorted(want)}"
    expect(dev.total_bytes, gpu_total(dev.kv_pages["cache"]), "total", "the sum of every line computed by hand")
    assert 0 <= dev.free_bytes < 2 * MiB, f"free {dev.free_bytes:,} B: a fill pool leaves less than one 2 MiB segment"


# ------------------------------------------------------------------ CPU: no capture, raw bytes

def test_cpu_plan(cpu):
    plan, dev = cpu
    assert plan.nodes["mlp"].graphs == {} and dev.capture_order == [], "a cpu target captures nothing"
    eager = {w: (b.captured, b.eager_above) for w, b in plan.nodes["mlp"].buckets.items()}
    assert eager == {w: ([], 0) for w in ("prefill", "mixed", "decode")}, (
        f"on cpu every walk runs eagerly at its budget: plan {eager}")
    want = {"weights.mlp", "kv.cache", "workspace.ws", "activations", "headroom"}
    assert set(dev.ledger) == want, f"cpu ledger lines: plan {sorted(dev.ledger)}, by hand {sorted(want)}"
    expect(dev.ledger["weights.mlp"], ARENA, "cpu weights.mlp", ARENA_WHY)
    expect(dev.ledger["workspace.ws"], WORKSPACE, "cpu workspace.ws", "declared 16 MiB per slot x 2 slots")
    expect(dev.ledger["activations"], peak(32), "cpu activations",
           "the largest eager step's live bytes: mixed at 32 tokens, h + g = 4 x 32 x F = 128 MiB "
           "(prefill@24: 96 MiB, decode@4: 16 MiB)")
    expect(dev.ledger["headroom"], 0, "cpu headroom", "no headroom on the cpu")
    pages = (CPU_BYTES - ARENA - WORKSPACE - peak(32)) // PAGE_BYTES
    assert dev.kv_pages["cache"] == pages, (
        f"cpu kv pages: plan {dev.kv_pages['cache']:,}, by hand floor((8 GiB - arena {ARENA:,} - workspace "
        f"{WORKSPACE:,} - activations {peak(32):,}) / {PAGE_BYTES}) = {pages:,} (no allocator on the cpu)")
    expect(dev.ledger["kv.cache"], pages * PAGE_BYTES, "cpu kv.cache", f"{pages:,} pages x {PAGE_BYTES} B")
    expect(dev.total_bytes, ARENA + WORKSPACE + peak(32) + pages * PAGE_BYTES, "cpu total", "the sum of the lines")


# ------------------------------------------------------------------ wrappers as the runtime allocates them

def test_cuda_core_decode_wrappers_hold_no_qo_indptr():
    plan = compile_model(load_model(MODEL, "cuda_core"), "h100", 1, FA2).plan   # 8 query heads on 2: group 4, CUDA cores
    want = INT_WORKSPACE + sum(n for fam, r in GPU_GRAPHS for _, n in wrapper_buffers(fam, r, decode_qo_indptr=False))
    expect(plan.devices[0].ledger["wrappers.cache"], want, "wrappers.cache with CUDA-core decode",
           "as test_wrappers, less the decode rungs' qo_indptr (4*2 + 4*3 + 4*5 = 40 B) that nothing allocates")


def test_triton_decode_wrappers():
    """sm_90's own decode choice: the Triton kernel's rungs keep the page table, the lengths and one split counter
    per (sequence, kv head), no int workspace, append indices or qo_indptr; its split partials sit in the declared
    workspace (16 MiB, far over 4 B x 4 seqs x 8 heads x 64 splits x 66 at most)."""
    plan = compile_model(load_model(MODEL), "h100").plan
    assert plan.resources["cache"].decode_backend == "triton"
    prefill = sum(n for fam, r in GPU_GRAPHS if fam.startswith("prefill") for _, n in wrapper_buffers(fam, r))
    # decode rungs of T seqs: kv_indptr 4*(T+1) + kv_indices 4*T*64 + last 4*T + split_counts 4*T*1 kv head
    decode = (8 + 256 + 4 + 4) + (12 + 512 + 8 + 8) + (20 + 1024 + 16 + 16)
    expect(plan.devices[0].ledger["wrappers.cache"], INT_WORKSPACE + prefill + decode, "wrappers.cache on triton decode",
           "the prefill rungs' FlashInfer buffers and one int workspace, and per decode rung of T seqs kv_indptr "
           "4*(T+1), kv_indices 4*T*64, kv_last_page_len 4*T, split_counts 4*T")


def test_wrappers_use_the_family_step():
    # prefill budgets 1 seq and mixed 4: the family prefill:tokens runs its rungs 8/16/24 with 4 seqs
    plan = compile_model(load_model(MODEL, "split_seqs"), "h100", 1, FA2).plan
    want = INT_WORKSPACE + sum(n for fam, r in GPU_GRAPHS for _, n in wrapper_buffers(fam, r, family_seqs=4))
    expect(plan.devices[0].ledger["wrappers.cache"], want, "wrappers.cache with 1- and 4-seq walks in one family",
           "prefill rungs at the family's 4 seqs: qo_indptr and kv_indptr 4*5, kv_indices 4*4*64, last 4*4")
