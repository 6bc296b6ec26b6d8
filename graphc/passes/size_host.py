"""What each GPU device's worker holds in its host's memory, line by line (issue 40): devices on one host share
its memory, and a plan that promises the cards room must not leave the host short.

  pinned    page-locked memory: each FlashInfer wrapper keeps a page-locked copy of its int workspace
            (one per captured graph's attention role, one per eager node and phase; the boot builds up to
            BOOT_WRAPPERS more for its warm-up steps, dropped again), each a torch host-allocator block,
            a power of two; the sampled tokens' read-back copies (READBACK_BYTES); and the blocks a step's
            large host inputs (patches, mel frames) are copied from (input_blocks: a block per input
            port, INPUT_SETS steps' worth at once, kept by the allocator for the next).
  staging   the weight loader's chunk (hostmem.STAGING_BYTES, graphc/runtime/checkpoint.py) as read and as cast.
  process   CUDA's host side, torch and the kernel libraries, the captured graphs' host state:
            calibrated, host_base + host_per_launch x the device's captured kernel launches.

CPU targets have none of this: their devices' ledgers are host memory already (targets.split_host).
"""
from __future__ import annotations

from graphc.host_inputs import INPUT_SETS, host_block, input_blocks
from graphc.hostmem import STAGING_BYTES
from graphc.ir import IR
from graphc.passes.tally_ledger import Item, Sizing, capture_order, graph_launches
from graphc.targets import calibration
from graphc.units import fmt_bytes

BOOT_WRAPPERS = 2               # warm-up wrappers the boot builds and drops (seen on the H200: 39 = 36 + 1 + 2)
READBACK_BYTES = 1 << 20        # page-locked read-backs of sampled tokens: small blocks, under 1 MiB on the H200
def _int_workspace(s: Sizing, res: str, step, rung: int) -> int:
    """Bytes of the page-locked int workspace a FlashInfer wrapper of res keeps for this step at this rung (an
    eager step: at its budget), 0 for none."""
    spec = s.ir.model.resource(res)
    if not hasattr(spec, "int_workspace_bytes"):          # attention resources: every one has a chosen backend
        return 0
    shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
    names = [name for name, _ in spec.wrapper_allocs(s.backends.backend(res, step.phase), shape)]
    return host_block(spec.int_workspace_bytes) if "int_workspace" in names else 0


def pinned_blocks(s: Sizing, nodes: list[str]) -> list[int]:
    """Each page-locked int workspace the device's wrappers keep: captured graphs', then one per eager node and
    phase (the engine keeps one eager backend for each)."""
    ir: IR = s.ir
    steps = [(ir.family(node, fam), node, rung) for node, fam, rung in capture_order(s, nodes)]
    eager = {(st.node, st.phase): st for st in ir.steps if st.node in nodes and (st.node, st.walk) in s.buckets.eager}
    steps += [(st, node, st.budget) for (node, _), st in sorted(eager.items())]
    return [b for step, node, rung in steps for res in ir.node(node).resources.values()
            if (b := _int_workspace(s, res, step, rung))]


def size_host(s: Sizing, nodes: list[str]) -> list[Item]:
    """The host lines of one GPU device's worker; [] on a CPU target."""
    if not s.ir.target.is_gpu:
        return []
    blocks = pinned_blocks(s, nodes)
    boot = BOOT_WRAPPERS * max(blocks, default=0)
    ports = input_blocks(s.ir, nodes)
    inputs = INPUT_SETS * sum(ports.values())
    each = ", ".join(f"{node}.{port} {fmt_bytes(b)}" for (node, port), b in ports.items())
    staged = f" + large host inputs {fmt_bytes(inputs)}: {INPUT_SETS} steps x a block each ({each})" if ports else ""
    cal = calibration(s.ir.target)
    launches = graph_launches(s, nodes)[1]
    process = cal.host_base_bytes + cal.host_launch_bytes * launches
    return [
        Item("pinned", sum(blocks) + boot + READBACK_BYTES + inputs, "formula",
             f"{len(blocks)} FlashInfer wrappers x their page-locked int workspace ({fmt_bytes(sum(blocks))}) + "
             f"{BOOT_WRAPPERS} the boot drops ({fmt_bytes(boot)}) + read-backs {fmt_bytes(READBACK_BYTES)}{staged}"),
        Item("staging", 2 * STAGING_BYTES, "formula",
             f"the weight loader's chunk, as read and as cast: 2 x {fmt_bytes(STAGING_BYTES)}"),
        Item("process", process, "calibrated",
             f"{fmt_bytes(cal.host_base_bytes)} + {cal.host_launch_bytes:,} B x {launches:,} captured launches "
             f"({cal.host_source})"),
    ]
