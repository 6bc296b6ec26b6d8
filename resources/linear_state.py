"""Linear-attention state slots: a fixed-size state per sequence for every Gated DeltaNet layer.

Whatever a sequence's length, each linear-attention layer keeps for it
    conv state       [conv_dim, kernel - 1]                     the last kernel-1 pre-conv rows of q|k|v
    recurrent state  [value_heads, key_head_dim, value_head_dim]  the delta rule's S (K-major, as HF and FLA)
with conv_dim = 2 * key_heads * key_head_dim + value_heads * value_head_dim. One allocation per group:
conv [num_layers, slots, conv_dim, kernel - 1] in conv_dtype and recurrent [num_layers, slots, value_heads,
key_head_dim, value_head_dim] in state_dtype (fp32 by default, as the checkpoints' mamba_ssm_dtype says).
A request holds one slot from admission to its end (SlotAllocator); a step reads and writes its sequences'
slots through a StateStep. A sequence's first chunk starts from zeros whatever the slot holds, so a freed
slot is reused without clearing. torch is imported where tensors are made: the spec reads without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from graphc.units import DTYPE_BYTES
from resources.base import ResourceSpec, Sized, StepShape
from resources.paged_kv import PageAllocator

STATE_DTYPES = ("bfloat16", "float16", "float32")

if TYPE_CHECKING:
    import torch


class LinearStateSpec(ResourceSpec):
    """State slots for `num_layers` linear-attention layers; bytes are exact (see the *_bytes docstrings)."""

    kind: ClassVar[str] = "linear_state"
    num_layers: int = Field(ge=1)          # linear-attention layers (24 of Qwen3.5-9B's 32)
    num_key_heads: int = Field(ge=1)
    num_value_heads: int = Field(ge=1)
    key_head_dim: int = Field(ge=1)
    value_head_dim: int = Field(ge=1)
    conv_kernel: int = Field(4, ge=2)      # the depthwise conv's width; its state keeps kernel - 1 rows
    conv_dtype: str = "bfloat16"           # the model's dtype: the conv state holds projection outputs
    state_dtype: str = "float32"           # the recurrent state's; fp32 even under bf16 weights
    slots: int | None = Field(None, ge=1)  # None: the compiler's count (graphc/passes/size_resources.py)
    backend: str = "auto"                  # the delta rule's kernels: resources/capabilities.py's linear_state row

    @model_validator(mode="after")
    def _check(self) -> "LinearStateSpec":
        for field in ("conv_dtype", "state_dtype"):
            if getattr(self, field) not in STATE_DTYPES:
                raise ValueError(f"{field} '{getattr(self, field)}' is not one of {sorted(STATE_DTYPES)}")
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"num_value_heads {self.num_value_heads} must be a multiple of num_key_heads "
                             f"{self.num_key_heads}: each key head serves a whole group of value heads")
        return self

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_layer_bytes(self) -> int:
        """One layer, one slot: (2 x key_dim + value_dim) x (kernel - 1) x conv_dtype bytes."""
        return self.conv_dim * (self.conv_kernel - 1) * DTYPE_BYTES[self.conv_dtype]

    @property
    def recurrent_layer_bytes(self) -> int:
        """One layer, one slot: value_heads x key_head_dim x value_head_dim x state_dtype bytes."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim * DTYPE_BYTES[self.state_dtype]

    @property
    def slot_bytes(self) -> int:
        """One sequence's state in every layer: num_layers x (conv_layer_bytes + recurrent_layer_bytes)."""
        return self.num_layers * (self.conv_layer_bytes + self.recurrent_layer_bytes)

    def conv_formula(self) -> str:
        return (f"(2 x {self.num_key_heads} x {self.key_head_dim} + {self.num_value_heads} x {self.value_head_dim})"
                f" channels x {self.conv_kernel - 1} rows x {DTYPE_BYTES[self.conv_dtype]} B"
                f" = {self.conv_layer_bytes} B per layer per slot")

    def recurrent_formula(self) -> str:
        return (f"{self.num_value_heads} value heads x {self.key_head_dim} x {self.value_head_dim}"
                f" x {DTYPE_BYTES[self.state_dtype]} B = {self.recurrent_layer_bytes} B per layer per slot")

    def lines(self, slots: int) -> list[tuple[str, Sized]]:
        """The ledger's lines for `slots` slots, one per layer group: (f"{name}.conv", ...), (f"{name}.recurrent", ...)."""
        per = ((f"{self.name}.conv", self.conv_layer_bytes, self.conv_formula()),
               (f"{self.name}.recurrent", self.recurrent_layer_bytes, self.recurrent_formula()))
        return [(label, Sized(self.num_layers * slots * b, f"{self.num_layers} layers x {slots} slots x {formula}"))
                for label, b, formula in per]

    def bytes_for(self, slots: int) -> int:
        """slots x slot_bytes: what the lines add up to."""
        return slots * self.slot_bytes

    def step_shape(self, axis: str, sizes: dict[str, int], phase: str) -> StepShape:
        """A step's rows and sequences (each sequence reads and writes its one slot; no key span)."""
        rows = sizes.get("tokens", sizes[axis])
        return StepShape(rows=rows, seqs=min(rows, sizes.get("seqs", 1)), kv_len=0, phase=phase)

    def wrapper_allocs(self, backend: str | None, shape: StepShape) -> list[tuple[str, int]]:
        """Fixed buffers of one captured rung's binding (CapturedState): its slot ids (int64) and has_state
        (bool), one of each per sequence."""
        return [("slot_ids", 8 * shape.seqs), ("has_state", shape.seqs)]

    def fake(self, shape: StepShape, run_head_dim: int | None = None) -> "StateStep":
        """The simulation's binding: a StateStep over meta slots, the step's rows split evenly over its
        sequences, each continuing from its slot (the costlier path: the slot's state is read)."""
        state = new_state(self, shape.seqs + 1, device="meta")
        base, extra = divmod(shape.rows, shape.seqs)
        lens = [base + (i < extra) for i in range(shape.seqs)]
        return StateStep(state, list(range(shape.seqs)), lens, [True] * shape.seqs)


class SlotAllocator:
    """One state slot per running sequence: PageAllocator's free list, a slot at a time, with its refusals
    (a slot is given back once) in terms of slots."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"a slot pool needs at least 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self.reserved = 0                  # slots taken for good (a captured rung's padding slot)
        self._pool = PageAllocator(num_slots)

    def reserve(self) -> int:
        """A slot no request will hold (the plan's padding slot, which captured rungs' padding rows write)."""
        slot = self.allocate()
        self.reserved += 1
        return slot

    @property
    def num_free(self) -> int:
        return self._pool.num_free

    def can_allocate(self) -> bool:
        return self._pool.can_allocate(1)

    def allocate(self) -> int:
        if not self.can_allocate():
            raise RuntimeError(f"no free state slot: all {self.num_slots} slots are held by running sequences; "
                               "call can_allocate() first and keep the request waiting until one finishes, "
                               "or plan more slots")
        return self._pool.allocate(1)[0]

    def free(self, slot: int) -> None:
        try:
            self._pool.free([slot])
        except RuntimeError:
            raise RuntimeError(f"freeing state slot {slot} that is not held (never allocated, already freed or out "
                               f"of range 0..{self.num_slots - 1}); {self.num_slots - self.num_free} of "
                               f"{self.num_slots} are held") from None

    def all_free(self) -> bool:
        """The leak check: an idle engine holds no slot (but the reserved ones)."""
        return self.num_free == self.num_slots - self.reserved


@dataclass
class LinearState:
    """The slot tensors: conv [layers, slots, conv_dim, kernel - 1], recurrent [layers, slots, HV, dk, dv]."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.conv.shape[1]


def new_state(spec: LinearStateSpec, num_slots: int, device: str | torch.device = "cpu") -> LinearState:
    import torch

    conv = torch.zeros(spec.num_layers, num_slots, spec.conv_dim, spec.conv_kernel - 1,
                       dtype=getattr(torch, spec.conv_dtype), device=device)
    recurrent = torch.zeros(spec.num_layers, num_slots, spec.num_value_heads, spec.key_head_dim,
                            spec.value_head_dim, dtype=getattr(torch, spec.state_dtype), device=device)
    return LinearState(conv, recurrent)


class StateStep:
    """One step's sequences and their slots, bound to a linear-attention node's state role.

    The step's rows are its sequences' new rows back to back: sequence i owns rows cu_seqlens[i]:cu_seqlens[i+1]
    and slot slot_ids[i]. has_state[i] says whether that slot holds the sequence's state so far (False for
    its first chunk: the layers start it from zeros and never read the slot).
    StateStep(state) is unplanned until plan() (an eager GPU step's binding, planned before each step).
    """

    def __init__(self, state: LinearState, slot_ids: list[int] | None = None, seq_lens: list[int] | None = None,
                 has_state: list[bool] | None = None):
        self.state = state
        if slot_ids is not None:
            self.plan(slot_ids, seq_lens, has_state)

    def plan(self, slot_ids: list[int], seq_lens: list[int], has_state: list[bool]) -> None:
        import torch

        check_layout(slot_ids, seq_lens, has_state, self.state.num_slots)
        if len(set(slot_ids)) != len(slot_ids):
            raise ValueError(f"slot ids {slot_ids} must be distinct: two sequences of one step never share a slot")
        self._lens(seq_lens)
        self._seq = self._cu = None
        device = self.state.conv.device
        # async copies (staged now): a host sync here would wait for the step in flight
        self.slots = torch.tensor(slot_ids, dtype=torch.long).to(device, non_blocking=True)           # [N]
        self.has_state = torch.tensor([bool(h) for h in has_state]).to(device, non_blocking=True)      # [N]

    def _lens(self, seq_lens: list[int]) -> None:
        self.seq_lens = [int(x) for x in seq_lens]
        self.cu_seqlens = [0]
        for x in self.seq_lens:
            self.cu_seqlens.append(self.cu_seqlens[-1] + x)

    @property
    def num_rows(self) -> int:
        return self.cu_seqlens[-1]

    def cu_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's offsets cu_seqlens as int64 (on the host, on the pool's device), made once a step: every
        layer of the step passes these same two tensors (eager steps only)."""
        import torch

        if getattr(self, "_cu", None) is None:
            host = torch.tensor(self.cu_seqlens, dtype=torch.long)
            self._cu = (host, host.to(self.state.conv.device, non_blocking=True))
        return self._cu

    def row_sequences(self) -> torch.Tensor:
        """seq [T] int32 on the pool's device: each row's sequence, made once a step (eager steps only: a kernel
        that finds its row's sequence reads it, with cu_tensors' offsets)."""
        import torch

        if getattr(self, "_seq", None) is None:
            device = self.state.conv.device
            if device.type == "meta":          # the compiler's trace: no values, and no torch op on the host (a
                self._seq = torch.empty(self.num_rows, dtype=torch.int32, device=device)  # parallel one would
            else:                              # start OpenMP threads, which a later fork cannot take along)
                import numpy as np

                seq = torch.from_numpy(np.repeat(np.arange(len(self.seq_lens), dtype=np.int32), self.seq_lens))
                self._seq = seq.to(device, non_blocking=True)
        return self._seq

    def persistent(self) -> list[torch.Tensor]:
        """Tensors that exist before the step runs (the pool and this step's index tensors, its offsets and
        rows' sequences among them: the host makes those for the step, whichever layer asks first): a trace of
        the step does not count them as its allocations."""
        return [self.state.conv, self.state.recurrent, self.slots, self.has_state, self.cu_tensors()[1],
                self.row_sequences()]

    def conv(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s conv slots [slots, conv_dim, kernel - 1] (a view: writes land in the pool)."""
        return self.state.conv[layer]

    def recurrent(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s recurrent slots [slots, HV, dk, dv] (a view: writes land in the pool)."""
        return self.state.recurrent[layer]


def check_layout(slot_ids: list[int], seq_lens: list[int], has_state: list[bool], num_slots: int) -> None:
    """One slot, one length (at least 1) and one has_state per sequence, every slot within the pool."""
    n = len(slot_ids)
    if not n or len(seq_lens) != n or len(has_state) != n:
        raise ValueError(f"a step needs one slot, one length and one has_state per sequence: got {n} slots, "
                         f"{len(seq_lens)} lengths and {len(has_state)} has_state")
    bad = [s for s in slot_ids if not 0 <= s < num_slots]
    if bad:
        raise ValueError(f"slot ids {slot_ids} must lie within 0..{num_slots - 1} (out of range: {bad})")
    if any(int(x) < 1 for x in seq_lens):
        raise ValueError(f"every sequence of a step brings at least one row, got lengths {seq_lens}; "
                         "leave a sequence with no new rows out of the step")


def pad_state(slot_ids: list[int], seq_lens: list[int], has_state: list[bool], seqs: int, pad: int
              ) -> tuple[list[int], list[int], list[bool]]:
    """A decode layout padded to exactly `seqs` one-row sequences: the padding ones on slot `pad` (the plan's
    padding slot, which no request holds), from zeros. Their rows compute garbage into that slot only."""
    if len(slot_ids) > seqs:
        raise ValueError(f"{len(slot_ids)} sequences do not fit a captured rung of {seqs}")
    if pad in slot_ids:
        raise ValueError(f"slot {pad} is the padding slot; a running sequence holds it (slots {slot_ids})")
    spare = seqs - len(slot_ids)
    return list(slot_ids) + [pad] * spare, list(seq_lens) + [1] * spare, list(has_state) + [False] * spare


class CapturedState(StateStep):
    """A captured decode rung's binding: `seqs` one-row sequences whose slot ids and has_state live in static
    tensors, rewritten by plan() before each replay (pad_state pads a smaller step to the rung). The padding
    slot may repeat; every real slot is distinct."""

    def __init__(self, state: LinearState, shape: StepShape):
        import torch

        if shape.rows != shape.seqs:
            raise ValueError(f"a captured state step runs one row per sequence (decode); this rung has {shape.rows} "
                             f"rows for {shape.seqs} sequences")
        super().__init__(state)
        device = state.conv.device
        self.slots = torch.zeros(shape.seqs, dtype=torch.long, device=device)
        self.has_state = torch.zeros(shape.seqs, dtype=torch.bool, device=device)
        self._lens([1] * shape.seqs)

    def plan(self, slot_ids: list[int], seq_lens: list[int], has_state: list[bool]) -> None:
        import torch

        check_layout(slot_ids, seq_lens, has_state, self.state.num_slots)
        if len(slot_ids) != len(self.seq_lens) or any(int(x) != 1 for x in seq_lens):
            raise ValueError(f"a captured decode rung of {len(self.seq_lens)} sequences takes exactly that many "
                             f"one-row sequences (pad_state pads); got lengths {seq_lens}")
        self.slots.copy_(torch.tensor(slot_ids, dtype=torch.long), non_blocking=True)
        self.has_state.copy_(torch.tensor([bool(h) for h in has_state]), non_blocking=True)
