"""The counting sort's blocks: how many token-expert pairs each of its programs takes, and how many programs
there are, for a step of P pairs. Its operators (moe_ops.py) size the counts buffer by it, on any device and
with no GPU stack; its kernels (moe_triton.py) check the buffer they are given against it."""
from __future__ import annotations

# the counting sort's blocks: at least COUNT_BLOCK pairs a program (a power of two), and at most COUNT_BLOCKS
# programs, so that each program's read of every block's counts stays one [COUNT_BLOCKS, E] tile
COUNT_BLOCK, COUNT_BLOCKS = 128, 128


def count_blocks(pairs: int) -> tuple[int, int]:
    """(pairs a block, blocks) of the counting sort for this many pairs."""
    block = COUNT_BLOCK
    while block * COUNT_BLOCKS < pairs:
        block *= 2
    return block, -(-pairs // block)
