"""The page-locked blocks a GPU device's large host inputs are staged in (patches, mel frames): the rule the
plan's `pinned` host line counts (graphc/passes/size_host.py) and graphc/runtime/executor.py stages by. Core:
no torch, no compiler pass."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphc.ir import IR

PIN_BYTES = 4 << 20             # a step's host inputs from this size up reach a GPU through page-locked blocks
INPUT_SETS = 2                  # steps whose input blocks can be held at once: one launched, its copies not yet
                                # run, and the next one's (the engine reads a step back before it builds the one after)


def host_block(n: int) -> int:
    """The block torch's page-locked host allocator takes for n bytes (a power of two)."""
    return 1 << max(n - 1, 0).bit_length()


def input_blocks(ir: "IR", nodes: list[str]) -> dict[tuple[str, str], int]:
    """(node, port) -> the page-locked block that input is staged in on its way to a GPU: every input port of
    these nodes that the host feeds (no edge or link does) and that some step fills with PIN_BYTES or more at
    its walk's budget, as a host-allocator block of its largest fill. graphc/runtime/executor.py stages by
    it; graphc/passes/size_host.py plans INPUT_SETS of each."""
    fed = {e.ends()[1] for e in ir.model.edges}
    fed |= {(link.dst, port) for link in ir.model.links for port in link.inputs}
    blocks: dict[tuple[str, str], int] = {}
    for st in ir.steps:
        if st.node not in nodes:
            continue
        for p in st.inputs:
            n = ir.node(st.node).inputs[p].nbytes(st.sizes_at(st.budget))
            if (st.node, p) not in fed and n >= PIN_BYTES:
                blocks[(st.node, p)] = max(blocks.get((st.node, p), 0), host_block(n))
    return dict(sorted(blocks.items()))
