"""graphc/passes/tally_ledger.py function by function, against expectations worked out by hand.

Two models: tests/tally_model.py (four independent nodes, so what a device holds can be read off the
subset of nodes it is given: two convolutions, a paged and a ragged attention node) and
tests/oracle_model.py (one node whose every ledger line tests/unit/test_ledger_oracle.py computes by
hand). Both are run through the passes before placement only (verify_graph .. size_resources), and
tally_ledger is called with the node subsets and page counts each test picks. Constants come from
the declarations, graphc/calibration.yaml, the target catalog's published capacities,
resources/capabilities.py's tables and c10's caching-allocator rules (docs/design-notes.md); no
expected value is copied from the code's output.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from graphc import convws
from graphc.passes.choose_buckets import choose_buckets
from graphc.passes.select_backends import Choice, select_backends
from graphc.passes.simulate_steps import simulate_steps
from graphc.passes.size_resources import size_resources
from graphc.passes.size_weights import size_weights
from graphc.passes.tally_ledger import (DeviceLedger, Item, Sizing, _conv_note, capture_order, capture_pool_bytes,
                                        device_convs, general_pool_bytes, kernel_modules, overhead_bytes,
                                        persistent_allocs, tally_ledger)
from graphc.verify import verify_graph
from graphc.source import load_model
from graphc.targets import get_target
from graphc.trace import Trace
from tests import tally_model as tm
from tests.unit.test_ledger_oracle import GPU_GRAPHS, wrapper_buffers

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
H100_BYTES = 85_017_493_504              # torch's total on an H100 SXM 80GB HBM3 (measured)
CAL = yaml.safe_load((ROOT / "graphc" / "calibration.yaml").read_text())["entries"]["sm_90"]
SIG_A8, SIG_A32 = tm.conv_sig(tm.CA, 8), tm.conv_sig(tm.CA, 32)      # a's graph and a's eager step
SIG_B8, SIG_B16 = tm.conv_sig(tm.CB, 8), tm.conv_sig(tm.CB, 16)      # b's two graphs
ALL = ["a", "b", "p", "r"]


def sizing(path: str, gpu: str) -> Sizing:
    """Every pass before placement, as graphc.pipeline.run_passes runs them."""
    ir = verify_graph(load_model(path).model, get_target(gpu), 1)
    backends, buckets = select_backends(ir), choose_buckets(ir)
    return Sizing(ir, backends, buckets, size_weights(ir), simulate_steps(ir, buckets, backends),
                  size_resources(ir, backends, buckets))


@pytest.fixture(scope="module")
def h100() -> Sizing:
    return sizing(str(ROOT / "tests" / "tally_model.py"), "h100")


@pytest.fixture(scope="module")
def cpu() -> Sizing:
    return sizing(str(ROOT / "tests" / "tally_model.py"), "cpu")


@pytest.fixture(scope="module")
def oracle() -> Sizing:
    return sizing(str(ROOT / "tests" / "oracle_model.py"), "h100")


def trace(*sizes: int, peak: int | None = None, launches: int = 1) -> Trace:
    """A step that allocates these sizes in order, then frees them in order."""
    events = tuple((1, i, n) for i, n in enumerate(sizes)) + tuple((0, i, n) for i, n in enumerate(sizes))
    return Trace(events, sum(sizes) if peak is None else peak, 0, len(sizes), launches)


def detail(led: DeviceLedger, component: str) -> str:
    (item,) = [i for i in led.items if i.component == component]
    return item.detail


# ------------------------------------------------------------------ DeviceLedger

def test_get_sums_only_the_named_component():
    led = DeviceLedger(0, 100, [], [Item("a", 1, "exact", ""), Item("b", 2, "exact", ""), Item("a", 30, "exact", "")],
                       {})
    assert (led.get("a"), led.get("b"), led.get("c")) == (31, 2, 0), "get sums every item of one component, 0 if none"
    assert (led.total, led.free) == (33, 67)


def test_get_on_a_tallied_ledger(h100):
    led = tally_ledger(h100, 0, ["a", "b"], {})
    # static x and y at each family's largest rung: a at 8 tokens x 4 channels, b at 16 x 16, bf16
    assert led.get("graph_io.a") == 2 * 8 * 4 * 2
    assert led.get("graph_io.b") == 2 * 16 * 16 * 2
    assert led.get("graph_io.p") == 0, "p is not on this device"


# ------------------------------------------------------------------ capture order

def test_capture_order_breaks_ties_by_node_family_then_larger_rung():
    """Largest peak first; equal peaks by node, then family, then the larger rung first."""
    big, tie = trace(peak=100), trace(peak=10)
    graphs = {("b", "decode:seqs", 4): (None, tie), ("a", "prefill:tokens", 8): (None, tie),
              ("a", "decode:seqs", 2): (None, tie), ("a", "prefill:tokens", 4): (None, tie),
              ("a", "decode:seqs", 4): (None, tie), ("z", "prefill:tokens", 1): (None, big),
              ("c", "prefill:tokens", 64): (None, trace(peak=1000))}          # c is not on the device
    s = SimpleNamespace(acts=SimpleNamespace(graphs=graphs))
    assert capture_order(s, ["a", "b", "z"]) == [
        ("z", "prefill:tokens", 1),
        ("a", "decode:seqs", 4), ("a", "decode:seqs", 2), ("a", "prefill:tokens", 8), ("a", "prefill:tokens", 4),
        ("b", "decode:seqs", 4)]


# ------------------------------------------------------------------ the two pools' allocator replays

def test_capture_pool_takes_cublas_only_when_something_is_captured():
    step = trace(3 * MiB)                                    # 1-10 MiB: one 20 MiB segment
    assert capture_pool_bytes([step]) == 20 * MiB, "no stream workspace unless one is given"
    # the 32 MiB workspace is a 2 MiB multiple >= 10 MiB: its own segment, never freed
    assert capture_pool_bytes([step], 32 * MiB) == (32 + 20) * MiB
    assert capture_pool_bytes([], 32 * MiB) == 0, "no graph captured: no capture stream, no cuBLAS workspace"


def test_device_without_graphs_has_an_empty_capture_pool(h100):
    led = tally_ledger(h100, 0, [], {})
    assert led.get("capture_pool") == 0 and led.capture_order == []
    assert detail(led, "capture_pool") == \
        "0 graphs captured largest first into one pool; allocator model of their traces"


def test_general_pool_caches_nothing_by_default():
    # one 3 MiB allocation: a 20 MiB segment; nothing cached unless asked
    assert general_pool_bytes([3 * MiB], []) == (20 * MiB, 20 * MiB)
    # eager steps reuse the persistent segment's 17 MiB tail when they fit it (12 MiB), else take their own
    # segment (18 MiB: >= 10 MiB, a 2 MiB multiple)
    assert general_pool_bytes([3 * MiB], [trace(12 * MiB)]) == (20 * MiB, 20 * MiB)
    assert general_pool_bytes([3 * MiB], [trace(18 * MiB)]) == (20 * MiB, 38 * MiB)


def test_flashinfer_transient_is_8_mib(oracle):
    """FlashInfer's replaced int workspace is 8 MiB. The oracle's general pool with no KV pages: the arena's
    segment tail is 2 MiB - 512 B, the workspace slots are exactly 16 MiB segments, the small buffers share a
    2 MiB segment, and the one 8 MiB int workspace the wrappers share opens a 20 MiB segment whose tail takes
    the cached 8 MiB: 4 MiB stay free there (a 9 MiB transient would leave 3). So an eager step of 3.5 MiB
    fits that tail (no new segment) and one of 4.5 MiB opens a 20 MiB segment of its own."""
    s = replace(oracle, acts=replace(oracle.acts, eager={("mlp", "mixed"): trace(3 * MiB + 512 * KiB)}))
    led = tally_ledger(s, 0, ["mlp"], {"cache": 0})
    assert led.get("activations") == 0, "a 3.5 MiB step fits the int workspace segment's 4 MiB tail"
    s = replace(oracle, acts=replace(oracle.acts, eager={("mlp", "mixed"): trace(4 * MiB + 512 * KiB)}))
    assert tally_ledger(s, 0, ["mlp"], {"cache": 0}).get("activations") == 20 * MiB
    assert detail(led, "allocator").endswith(", and FlashInfer's replaced 8 MiB int workspace, kept cached")


def test_no_wrappers_no_transient(h100):
    """a and b bind no attention resource: no wrapper, no FlashInfer workspace cached."""
    led = tally_ledger(h100, 0, ["a", "b"], {})
    # arenas (bf16, each tensor 256-B aligned): a 4x4x3 weight 96 B -> 256 + bias 8 -> 256 = 512;
    # b 16x16x3 weight 1,536 B + bias 32 -> 256 = 1,792; graph_io 64 + 64 (a) and 512 + 512 (b); all
    # small: one 2 MiB small segment
    raw = 512 + 1792 + 64 + 64 + 512 + 512
    assert led.get("allocator") == 2 * MiB - raw
    assert detail(led, "allocator") == "caching-allocator rounding and segment tails of 6 persistent allocations"


def test_eager_steps_replay_largest_peak_first(h100):
    """Eager steps warm the general pool largest peak first, as graphs are captured, so smaller steps
    reuse the larger one's freed block. Devices a and b hold one 2 MiB small segment and no wrapper.
    b's 25 MiB step takes its own 26 MiB segment (>= 10 MiB: rounded to 2 MiB); a's 3 MiB step then
    fits the freed 26 MiB block. (Smallest first would reserve 20 + 26 MiB.)"""
    eager = {("a", "wa"): trace(3 * MiB), ("b", "wb"): trace(25 * MiB)}
    led = tally_ledger(replace(h100, acts=replace(h100.acts, eager=eager)), 0, ["a", "b"], {})
    assert led.get("activations") == 26 * MiB
    assert detail(led, "activations") == "2 eager step(s) at their budgets: b@wb, a@wa"


# ------------------------------------------------------------------ workspaces

def test_undeclared_workspace_is_one_slot(h100):
    allocs = [a for a in persistent_allocs(h100, ["p"], {"kv": 16}) if a[0].startswith("workspace.")]
    # fa3 keeps no split-KV partials: need 0, the GPU floor of 1 MiB, in the one slot an undeclared workspace has
    assert allocs == [("workspace.kv", "slot0", MiB, "formula")]


def test_declared_workspace_slots_split_its_bytes(oracle):
    allocs = [a for a in persistent_allocs(oracle, ["mlp"], {"cache": 0}) if a[0].startswith("workspace.")]
    assert allocs == [("workspace.ws", "slot0", 16 * MiB, "declared"), ("workspace.ws", "slot1", 16 * MiB, "declared")]
    assert all(type(a[2]) is int for a in allocs), "bytes are whole numbers"
    # a total that two slots do not divide: each slot gets bytes // 2
    ws = oracle.resources.workspaces["ws"]
    odd = replace(oracle, resources=replace(oracle.resources, workspaces={"ws": replace(ws, bytes=32 * MiB + 1)}))
    sizes = [a[2] for a in persistent_allocs(odd, ["mlp"], {"cache": 0}) if a[0] == "workspace.ws"]
    assert sizes == [16 * MiB, 16 * MiB] and all(type(n) is int for n in sizes)


# ------------------------------------------------------------------ overhead, as placement estimates it

def test_overhead_on_a_gpu(oracle):
    """context + library + kernels (base + launches in the device's graphs x bytes per launch) + 1%."""
    fixed = CAL["context_bytes"] + CAL["library_bytes"] + CAL["kernels_base_bytes"]
    # the oracle captures 6 graphs of 5 launches each (mm, gelu, mm, two attention calls)
    assert overhead_bytes(oracle, ["mlp"]) == fixed + 30 * CAL["graph_launch_bytes"] + H100_BYTES // 100
    assert overhead_bytes(oracle, []) == fixed + H100_BYTES // 100
    assert overhead_bytes(replace(oracle, headroom=12345), []) == fixed + 12345


def test_overhead_on_cpu_is_the_headroom(cpu):
    assert overhead_bytes(cpu, ALL) == 0, "no context, library, kernels or default headroom on the cpu"
    assert overhead_bytes(replace(cpu, headroom=4096), ALL) == 4096


# ------------------------------------------------------------------ FlashInfer modules and convolutions

def test_kernel_modules_per_device(h100, cpu):
    # sm_90: paged prefill fa3 at head dim 64 (page + prefill), decode on triton (no FlashInfer module);
    # ragged prefill fa3 at head dim 128
    paged, ragged = ["page", "prefill:fa3:64"], ["prefill:fa3:128"]
    assert kernel_modules(h100, ["p"]) == paged
    assert kernel_modules(h100, ["r"]) == ragged
    assert kernel_modules(h100, ALL) == sorted(paged + ragged)
    assert kernel_modules(h100, ["a", "b"]) == [], "convolutions load no FlashInfer module"
    assert kernel_modules(cpu, ALL) == [], "torch backends load none"


def test_kernel_modules_skip_a_torch_resource_and_go_on(h100):
    """Each resource is judged on its own: one on the torch reference path (never planned on a GPU,
    but the function takes any Sizing) loads nothing, and the resources after it still load theirs."""
    chosen = {"kv": Choice("torch", "torch", 64, "reference"), "vis": h100.backends.chosen["vis"]}
    s = replace(h100, backends=replace(h100.backends, chosen=chosen))
    assert kernel_modules(s, ["p", "r"]) == ["prefill:fa3:128"]


def test_device_convs_are_this_devices(h100, cpu):
    assert device_convs(h100, ["a"]) == sorted([SIG_A8, SIG_A32]), "a's graph at 8 and its eager step at 32"
    assert device_convs(h100, ["b"]) == sorted([SIG_B8, SIG_B16])
    assert device_convs(h100, ["p", "r"]) == []
    assert device_convs(cpu, ALL) == [], "no cuDNN on the cpu"


def test_conv_note_counts_this_devices_signatures(h100):
    src = convws.source("sm_90")
    assert "measured on NVIDIA H200" in src
    tail = "signatures have no measured workspace and count as none: measure them with " \
           "examples/tools/calibrate_convs.py on the target"
    # none of the model's signatures is in conv_workspaces.yaml
    assert _conv_note(h100, ["a"]) == f"; cuDNN workspaces of 0 convolution signatures, {src}; 2 {tail}"
    # one of a's measured, one not; b's unmeasured one is not a's
    some = replace(h100, acts=replace(h100.acts, uncalibrated=frozenset({SIG_A8, SIG_B8})))
    assert _conv_note(some, ["a"]) == f"; cuDNN workspaces of 1 convolution signatures, {src}; 1 {tail}"
    measured = replace(h100, acts=replace(h100.acts, uncalibrated=frozenset({SIG_B8})))
    assert _conv_note(measured, ["a"]) == f"; cuDNN workspaces of 2 convolution signatures, {src}"
    assert _conv_note(h100, ["p"]) == "", "no convolution, no note"
    led = tally_ledger(h100, 0, ["b"], {})
    assert detail(led, "capture_pool").endswith(f"(33,554,432 B, calibrated); cuDNN workspaces of 0 convolution "
                                                f"signatures, {src}; 2 {tail}")


# ------------------------------------------------------------------ the detail texts `graphc explain` prints

def test_details_of_the_exact_and_formula_lines(h100):
    led = tally_ledger(h100, 0, ALL, {"kv": 16})
    # K and V x 1 layer x 16 tokens x 1 kv head x 64 dims x 2 B = 4,096 B per page
    assert detail(led, "kv.kv").startswith("16 pages x 4,096 B (") and led.get("kv.kv") == 16 * 4096
    assert detail(led, "workspace.kv") == "sized by formula: 1.00 MiB; largest need 0 B = fa3: no float workspace"
    for n in ("a", "b", "p", "r"):      # one family each: x and y
        assert detail(led, f"graph_io.{n}") == "2 static input/output buffers at each captured family's largest rung"
    # paged prefill wrapper: int workspace, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
    # append_indices, kv_lens; prefill fa3, decode triton
    assert detail(led, "wrappers.kv") == \
        "7 fixed buffers of captured fa3/triton wrappers (append_indices, int_workspace, kv_indices, kv_indptr, " \
        "kv_last_page_len, kv_lens, qo_indptr)"
    # ragged wrapper: int workspace, qo_indptr, kv_indptr; fa3 for both phases: named once
    assert detail(led, "wrappers.vis") == \
        "3 fixed buffers of captured fa3 wrappers (int_workspace, kv_indptr, qo_indptr)"
    assert [i.source for i in led.items if i.component.startswith(("workspace.", "wrappers."))] == ["formula"] * 4
    # a: a 4x4x3 weight and 4 biases = 52 bf16 params (104 B); b: 16x16x3 + 16 = 784 (1,568 B)
    assert detail(led, "weights.a") == "52 params = 104 B, buffers 0 B, in one arena of 2 tensors aligned to 256 B"
    assert detail(led, "weights.b") == "784 params = 1,568 B, buffers 0 B, in one arena of 2 tensors aligned to 256 B"


def test_details_of_the_oracle(oracle):
    led = tally_ledger(oracle, 0, ["mlp"], {"cache": 0})
    assert detail(led, "graph_io.mlp") == "4 static input/output buffers at each captured family's largest rung"
    # one shared int workspace + 3 prefill rungs x 6 + 3 decode rungs (on triton) x 4
    count = 1 + sum(len(wrapper_buffers(fam, r)) for fam, r in GPU_GRAPHS if fam.startswith("prefill")) + 3 * 4
    assert count == 31
    assert detail(led, "wrappers.cache") == \
        f"{count} fixed buffers of captured fa3/triton wrappers (append_indices, int_workspace, kv_indices, " \
        "kv_indptr, kv_last_page_len, kv_lens, qo_indptr, split_counts)"
    # 16 MiB x 2 slots, and the largest need size_resources found, with its formula: the triton decode's partials
    # at 4 seqs, 256 programs // (4 seqs x 1 kv head) = 64 splits of 64 dims + max + sum: 540,672 B
    assert 4 * 4 * 8 * 64 * 66 == 528 * KiB
    assert detail(led, "workspace.ws") == "declared: 32.00 MiB; largest need 528.00 KiB = 4 B x 4 seqs x 8 q heads x " \
        "64 splits x (64 dims + max + sum): each split's fp32 partial"


def test_details_of_the_calibrated_and_simulated_lines(h100):
    led = tally_ledger(h100, 0, ["p"], {"kv": 16})
    assert detail(led, "kernels") == (
        f"kernel code and driver reserves {CAL['kernels_base_bytes']:,} B (with 2 FlashInfer modules: page, "
        f"prefill:fa3:64) + 1 CUDA graphs holding 1 simulated kernel launches x {CAL['graph_launch_bytes']:,} B; "
        f"{CAL['kernels_how']}")
    assert detail(led, "context").endswith("measured on NVIDIA H200 on 2026-11-29 (driver 580.159.04, torch "
                                           "2.11.0+cu130): graphc check PLAN --emulate via examples/tools/boot_plans.py "
                                           "(docs/gpu-boot.md, docs/data/)")
    assert led.get("kernels") == CAL["kernels_base_bytes"] + CAL["graph_launch_bytes"]
    assert detail(led, "capture_pool") == ("1 graphs captured largest first into one pool; allocator model of their "
                                           "traces, plus the capture stream's cuBLAS workspace (33,554,432 B, "
                                           "calibrated)")
    assert detail(led, "activations") == "no eager steps"
    assert detail(led, "headroom") == "default: 1% of the device kept free"
    assert detail(tally_ledger(h100, 0, ["a"], {}), "activations") == "1 eager step(s) at their budgets: a@wa"
    assert detail(tally_ledger(replace(h100, headroom=0), 0, ["a"], {}), "headroom") == "--headroom"
    assert detail(tally_ledger(h100, 0, ["a"], {}), "kernels").startswith(
        f"kernel code and driver reserves {CAL['kernels_base_bytes']:,} B (with 0 FlashInfer modules: none) + 1 CUDA "
        f"graphs holding 2 simulated kernel launches")


# ------------------------------------------------------------------ the CPU ledger

def test_cpu_ledger(cpu):
    led = tally_ledger(cpu, 0, ["a", "b"], {})
    # every walk runs eagerly at its budget: a at 32 tokens peaks at 4 x 4 x 32 = 512 B, b at 16 at
    # 4 x 16 x 16 = 1,024 B; the line is the largest, not the sum
    assert [i.component for i in led.items] == ["weights.a", "weights.b", "activations", "headroom"]
    assert led.get("activations") == 1024
    assert detail(led, "activations") == "largest eager step's live bytes (2 eager steps)"
    assert tally_ledger(cpu, 0, ["a"], {}).get("activations") == 512
    assert tally_ledger(cpu, 0, [], {}).get("activations") == 0
    assert (led.get("headroom"), detail(led, "headroom")) == (0, "none on cpu")
    assert led.capacity == 8 * GiB and led.capture_order == []
