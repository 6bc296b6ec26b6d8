"""Speech out: a pipeline's follow and chunk stages beside its LLM, as planned walks.

A speaking request kind ends in a group of walks run side by side: the LLM's decode walk and every walk
of the follow stage (a second autoregressive stage fed by the LLM's rows) and of the chunk stage (codes to
audio). The LLM decodes the request's text as any text request; the follow stage starts as soon as the
text it needs exists and emits one frame of codes per step; the chunk stage turns frames into audio in
chunks as soon as a chunk's frames exist. The engine runs one walk a step, taking its lanes (LLM, follow,
chunk) in turn, so a request's first audio waits neither for its text to end nor other requests' text
for its audio.

What is model-specific (the follow stage's prompt rows and inputs, the text it speaks next, how frames
end and chunks are cut) comes from the model host's `speech` (graphc.serving.Speech); the lane schedules
rows, pages and rungs, and runs the steps.

Follow rows: a request's follow prompt (T rows), then one row per frame after the first: frame k is
sampled at row T - 1 + k, and a decode step feeds row T + k - 1 (the previous frame's next_embeds) to emit
frame k. Pages grow with the rows; a request whose next row finds the pool empty waits a step.

Host work behind the device (unless the engine's overlap is off: then each step is read at once): a follow
step's codes are copied to the host behind an event and read after the next follow step launched (its decode
rows feed the previous frames' next_embeds, on the device), so the host builds that step while the device
computes. A frame in flight counts for the request's next frame index and its max_frames; a request that the
late read finds ended (its end code) has one more frame in the step launched meanwhile: that frame is void
(never a frame, never audio), and its K/V lands in pages it frees at once, which the stream orders after that
step. A chunk that waits for frames in flight reads them first, and the engine reads them where no lane can
run before them. A void frame draws its noise like any (a request without a seed: from the shared generator,
so the frames of unseeded sampled requests depend on the overlap, as on what else runs). The text a frame
speaks comes from the LLM's output, whose last id may be a placeholder of a token still in flight
(graphc/runtime/flight.py): the host's Speech reads only the ids before it, and a frame whose text it names as
a placeholder waits for the read.

Sampling: each request's parameters (SpeechParams, the model's defaults where it names none) become one
row of the follow node's `sampling` input; the node samples inside its (captured) step. Beside each step
the lane draws every sampling row's random numbers on the device (`noise`, Exp(1)), from the request's own
generator when it has a seed, so its frames do not depend on what else runs, else from the lane's shared
one; and it keeps each request's `seen` mask (the first codes it generated, for the repetition penalty)
on the device, updated from the step's codes without a host read. Greedy requests draw nothing.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import Field

from graphc.errors import InvalidInput
from graphc.runtime.flight import to_host, wait
from graphc.serving import FollowPrompt, Speech, SpeechSampling
from graphc.stages import Pipeline, slot_frames
from graphc.strict import Strict
from resources.paged_kv import PagedKVSpec


class SpeechParams(Strict):
    """A request's speech: the voice (the model's default when None), the most codec frames, and the
    frames of its first audio chunk (the model's default when None; later chunks double, up to a slot).
    A smaller first chunk is heard sooner; speech that fits the first chunk is decoded in one piece.
    Sampling (SpeechSampling's fields; None: the model's default, its Speech.sampling; temperature 0 is
    greedy); seed: the request draws from
    its own generator, so its frames are the same alone or among others (else from the engine's)."""

    voice: str | None = None
    max_frames: int | None = Field(None, ge=1)
    first_chunk: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0)

    def sampling(self, defaults: SpeechSampling) -> SpeechSampling:
        """These parameters, the defaults where None."""
        given = {k: getattr(self, k) for k in SpeechSampling.model_fields if getattr(self, k) is not None}
        return SpeechSampling(**{**defaults.model_dump(), **given})


@dataclass
class SpeechState:
    voice: str
    max_frames: int | None
    first_chunk: int
    sampling: torch.Tensor                     # the follow node's `sampling` row, on the device
    greedy: bool
    seen: torch.Tensor                         # [seen_size] bool on the device: first codes generated so far
    generator: torch.Generator | None = None   # the request's own (seeded) noise generator
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)   # LLM rows the follow prompt reads
    hidden_rows: set[int] | None = None        # which rows those are (the host's, kept)
    ready: Any = None                          # a stream lane's: the CUDA event after the LLM's step that kept them
    prompt: FollowPrompt | None = None
    pages: list[int] = field(default_factory=list)
    computed: int = 0                          # follow rows with K/V in pages
    frames: list[list[int]] = field(default_factory=list)
    flying: int = 0                            # frames sampled by follow steps in flight (codes not read)
    next_embed: torch.Tensor | None = None     # the follow node's next input row, on the device
    ended: str | None = None                   # why the follow stage stopped: 'stop' (its end code), 'length'
    decoded: int = 0                           # frames already turned into audio
    chunk: int = 0                             # chunks sent
    audio: list[np.ndarray] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)    # when each chunk's audio was made (perf_counter)
    text_done: bool = False

    @property
    def done(self) -> bool:
        return self.ended is not None and self.decoded == len(self.frames)


@dataclass
class SpeechStep:
    walk: str
    reqs: list                                 # the requests it serves, in order
    sizes: dict[str, int]
    rungs: dict[str, int | None] = field(default_factory=dict)
    data: Any = None


class SpeechLane:
    """The follow and chunk stages of a pipeline, driven for the engine: schedule a step, run it."""

    def __init__(self, pipeline: Pipeline, speech: Speech, executor, boot, seed: int = 0, overlap: bool = False,
                 lead_ms: float | None = None):
        """seed: the shared noise generator's, for requests without their own. overlap: read each follow step's
        codes after the next one launched (else at once). lead_ms: a later chunk of a request still speaking may
        wait, while another lane has a step to run, as long as its request's audio leads playback by more than
        this (None: every chunk runs as soon as its frames exist)."""
        self.sh, self.executor, self.overlap, self.lead_ms = speech, executor, overlap, lead_ms
        self.inflight: _FollowFlight | None = None         # the follow step launched, its codes not yet read
        self.follow, self.chunk = pipeline.follow, pipeline.chunk
        model = boot.ir.model
        self.model = model
        self.kv_role, kv_res = next((role, r) for role, r in model.node(self.follow.node).resources.items()
                                    if isinstance(model.resource(r), PagedKVSpec))
        self.kv: PagedKVSpec = model.resource(kv_res)
        self.pages = executor.pools[kv_res]            # on the follow node's device, or kept here for its worker
        self.capacity = self.pages.num_pages - executor.reserved.get(kv_res, 0)
        self.prefill_budget = model.walk(self.follow.prefill).budget.axes()
        self.decode_seqs = model.walk(self.follow.decode).budget.seqs
        # the chunk stage's walks, shortest slot first: (slot frames, walk, slots a step)
        self.chunk_walks = sorted((slot_frames(model.walk(w).budget.axes()), w, model.walk(w).budget.seqs)
                                  for w in self.chunk.walks)
        self.sample_rate = self.chunk.sample_rate
        self.device = boot.device
        self.shared = torch.Generator(device=self.device).manual_seed(seed)
        self.no_noise = torch.zeros(speech.noise_shape, device=self.device)
        self.nothing_seen = torch.zeros(speech.seen_size, dtype=torch.bool, device=self.device)
        self.greedy_row = torch.zeros(len(speech.sampling_row(SpeechSampling())), device=self.device)
        # the CUDA stream of the stages' stream lane (graphc/lanes.py), where the plan gives them one; else None:
        # the device's main stream, which the LLM's steps run on
        self.stream = boot.streams.get(self.follow.node)

    def on_lane(self):
        """A context in which the stages' device work goes to their stream lane's stream (where they have one)."""
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def handed(self, reqs: list) -> None:
        """The LLM's step just launched on the main stream kept these requests' rows (or took them from the
        follow cache): with a stream lane, an event after it, which the lane waits for before reading them."""
        if self.stream is None:
            return
        done = torch.cuda.Event()
        done.record()
        for r in reqs:
            r.speech.ready = done

    def _take_over(self, s: SpeechState) -> None:
        """Before the lane's stream reads a request's LLM rows (made on the main stream): it waits for the step
        that kept them, and their memory is not reused until it has read them (record_stream)."""
        if self.stream is None:
            return
        if s.ready is not None:
            self.stream.wait_event(s.ready)
        for t in s.hidden.values():
            t.record_stream(self.stream)

    def new_state(self, params: SpeechParams | None) -> SpeechState:
        params = params or SpeechParams()
        voice = (params.voice or self.sh.default_voice).lower()
        if voice not in self.sh.voices:
            raise InvalidInput(f"unknown voice '{params.voice}'", f"this model speaks with: "
                               f"{', '.join(sorted(self.sh.voices))}", "pick one of those voices", param="voice")
        sampling = params.sampling(self.sh.sampling)
        gen = (torch.Generator(device=self.device).manual_seed(params.seed)
               if params.seed is not None and not sampling.greedy else None)
        with self.on_lane():                       # its row is read on the lane's stream only
            row = self._row(sampling)
        return SpeechState(voice=voice, max_frames=params.max_frames,
                           first_chunk=params.first_chunk or self.sh.first_chunk, sampling=row,
                           greedy=sampling.greedy, seen=self.nothing_seen, generator=gen)

    def _row(self, sampling: SpeechSampling) -> torch.Tensor:
        return torch.tensor(self.sh.sampling_row(sampling), dtype=torch.float32).to(self.device, non_blocking=True)

    def _sampling_inputs(self, emit: list, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step's sampling [rows, K], noise [rows, *noise_shape] and seen [rows, V]: the emitting requests'
        rows, then zeros (a discarded sample: greedy, nothing drawn). Drawn on the device, nothing read back."""
        states = [r.speech for r in emit]
        pad = rows - len(states)
        shared = [i for i, s in enumerate(states) if not s.greedy and s.generator is None]
        drawn = (torch.empty(len(shared), *self.sh.noise_shape, device=self.device).exponential_(
            generator=self.shared) if shared else None)
        noise = [self.no_noise] * rows
        for j, i in enumerate(shared):
            noise[i] = drawn[j]
        for i, s in enumerate(states):
            if s.generator is not None:
                noise[i] = torch.empty(self.sh.noise_shape, device=self.device).exponential_(generator=s.generator)
        sampling = torch.stack([s.sampling for s in states] + [self.greedy_row] * pad)
        seen = torch.stack([s.seen for s in states] + [self.nothing_seen] * pad)
        return sampling, torch.stack(noise), seen

    # ---- the follow stage
    def _prepare(self, req) -> None:
        s = req.speech
        if s.prompt is not None or s.ended:
            return
        self._take_over(s)
        fp = self.sh.follow_prompt(req.prompt, req.output, s.text_done, s.voice, s.hidden)
        if fp is None:
            return
        s.prompt = fp
        req.times["follow_prompt"] = time.perf_counter()
        if fp.empty:
            s.ended = "stop"
            return
        most = self.kv.max_seq_len - fp.rows + 1
        s.max_frames = min(s.max_frames or most, most)
        if most < 1:
            s.ended = "length"

    def _grow(self, s: SpeechState, rows: int) -> bool:
        need = self.kv.pages_for(rows) - len(s.pages)
        if need > 0:
            if not self.pages.can_allocate(need):
                return False
            s.pages += self.pages.allocate(need)
        return True

    def release(self, s: SpeechState) -> None:
        if s.pages:
            self.pages.free(s.pages)
            s.pages = []

    def _decode_ready(self, req) -> int | None:
        """The token the request's next frame speaks, when its next decode row can run (frames in flight
        count: a request whose frames reach max_frames waits for their read, which ends it)."""
        s = req.speech
        n = len(s.frames) + s.flying
        if s.prompt is None or s.ended or s.computed != s.prompt.rows + n - 1 or not n or n >= s.max_frames:
            return None
        return self._trailing(req, n)

    def _trailing(self, req, frame: int) -> int | None:
        """The token frame `frame` speaks, None until it is known on the host (a placeholder of the LLM's step in
        flight is not)."""
        t = self.sh.trailing(req.prompt, req.output, req.speech.text_done, frame)
        return None if t is None or t < 0 else t

    def schedule_follow(self, reqs: list) -> SpeechStep | None:
        """A follow step: decode rows of the requests whose next frame can run, then prompt rows of those
        still prefilling (a prefill step holds both; a decode step only decode rows), within the walk's budget."""
        for r in reqs:
            self._prepare(r)
        live = [r for r in reqs if r.speech.prompt is not None and not r.speech.ended]
        prefilling = [r for r in live if r.speech.computed < r.speech.prompt.rows]
        decode = [(r, t) for r in live if r not in prefilling and (t := self._decode_ready(r)) is not None]
        if not prefilling and not decode:
            return None
        if prefilling:
            walk, tokens, seqs = self.follow.prefill, self.prefill_budget["tokens"], self.prefill_budget["seqs"]
        else:
            walk, tokens, seqs = self.follow.decode, self.decode_seqs, self.decode_seqs
        b = _FollowBatch()
        for r, t in decode:
            if len(b.served) >= (seqs - 1 if prefilling else seqs) or b.rows >= tokens - (1 if prefilling else 0):
                break
            s = r.speech
            if self._grow(s, s.computed + 1):
                b.add(r, ("decode", s.next_embed, s.computed + s.prompt.delta), 1, t)
        for r in prefilling:
            if len(b.served) >= seqs or b.rows >= tokens:
                break
            self._add_prompt(b, r, tokens)
        return self._follow_step(walk, b) if b.served else None

    def _add_prompt(self, b: "_FollowBatch", r, tokens: int) -> None:
        """As many of the request's prompt rows as the step holds; its last row samples its first frame
        once the text that frame speaks is known (else the rows stop short of it)."""
        s = r.speech
        n = min(s.prompt.rows - s.computed, tokens - b.rows)
        if not self._grow(s, s.computed + n):
            return
        t = None
        if s.computed + n == s.prompt.rows:
            t = self._trailing(r, 0)
            if t is None:
                n -= 1
                if n == 0:
                    return
        b.add(r, ("prompt", s.prompt, s.computed, s.computed + n), n, t)

    def _follow_step(self, walk: str, b: "_FollowBatch") -> SpeechStep:
        real = len(b.samples)
        if not b.samples:                         # a step of partial prompts still runs one (discarded) sample
            b.samples.append(b.rows - 1)
            b.trailing.append(self.sh.trailing_pad)
        trailing = list(self.sh.embed(b.trailing))   # one lookup for the step's rows
        step = SpeechStep(walk, [r for r, _ in b.served], {self.follow.node: b.rows})
        step.data = (b.parts, b.samples, trailing, b.qo, b.kv, b.tables, b.emit[:real], b.served)
        return step

    def run_follow(self, step: SpeechStep) -> None:
        """Launch the step, then read the step in flight before it; with overlap off, read this one at once. A
        launch that fails leaves the step before it in flight (the next call reads it)."""
        flight = self._launch_follow(step)
        if self.inflight is not None:
            self.read_follow()
        self.inflight = flight
        if not self.overlap and flight is not None:
            self.read_follow()

    def _launch_follow(self, step: SpeechStep) -> "_FollowFlight | None":
        """Run the step on the device: each emitting request's next input row and seen ids stay there, its
        codes start their copy to the host (the flight, None when nothing emits)."""
        parts, samples, trailing, qo, kv, tables, emit, served = step.data
        node = self.follow.node
        rung = step.rungs.get(node)
        seqs = len(samples)
        if rung is not None and self.executor.gpu is not None:
            seqs = self.executor.steps[(node, step.walk)].sizes_at(rung)["seqs"]
        sampling, noise, seen = self._sampling_inputs(emit, len(samples))
        inputs = self.sh.follow_inputs(parts, samples, trailing, step.walk == self.follow.prefill, sampling, noise,
                                       seen)
        layouts = {self.kv_role: (qo, kv, tables), **self.sh.follow_layouts(seqs)}
        out = self.executor.run_node(node, step.walk, rung, step.sizes[node], inputs, layouts)
        for req, n in served:
            req.speech.computed += n
        if not emit:
            return None
        codes = out[self.follow.codes][:len(emit)]
        seen = seen[:len(emit)].scatter(1, self.sh.seen_codes(codes), True)      # each one's seen ids
        for i, req in enumerate(emit):
            s = req.speech
            s.seen, s.next_embed = seen[i], out["next_embeds"][i].clone()
            s.flying += 1
        return _FollowFlight(list(emit), *to_host((codes,)))

    def read_follow(self) -> None:
        """Read the follow step in flight: each emitting request's frame, or its end (the code that ends it is no
        frame). A request ended or closed since its launch skips its frame (void). An ended request's pages go."""
        flight, self.inflight = self.inflight, None
        wait(flight.done)
        codes = flight.host[0].tolist()
        for req, frame in zip(flight.emit, codes):
            s = req.speech
            s.flying -= 1
            if req.closed or s.ended:
                continue
            if self.sh.is_end(frame):
                s.ended = "stop"
            else:
                s.frames.append(frame)
                if len(s.frames) == 1:
                    req.times["first_frame"] = time.perf_counter()
                if len(s.frames) >= s.max_frames:
                    s.ended = "length"
            if s.ended:
                self.release(s)

    # ---- the chunk stage
    def _chunk_ready(self, s: SpeechState, ahead: int = 0) -> int:
        """New frames of the request's next chunk when it can run now (ahead: counting that many frames more),
        else 0."""
        have = len(s.frames) + ahead - s.decoded
        n = self.sh.chunk_frames(s.chunk, s.first_chunk)
        return min(n, have) if have > 0 and (have >= n or s.ended) else 0

    def urgent(self, r, now: float) -> bool:
        """The request's next chunk runs now: no lead is set, it is the first, its speech has ended, or its audio
        leads playback (from its first audio, in real time) by lead_ms or less."""
        s = r.speech
        if self.lead_ms is None or s.chunk == 0 or s.ended is not None:
            return True
        made = sum(len(a) for a in s.audio) / self.sample_rate
        return (made - (now - s.sent[0])) * 1e3 <= self.lead_ms

    def chunk_waits(self, reqs: list, defer: bool = False) -> bool:
        """Some request's next chunk waits only for frames of the follow step in flight (defer: and runs now)."""
        now = time.perf_counter()
        return self.inflight is not None and any(
            r.speech.flying and not r.speech.ended and not self._chunk_ready(r.speech)
            and self._chunk_ready(r.speech, r.speech.flying) and (not defer or self.urgent(r, now)) for r in reqs)

    def follow_urgent(self, reqs: list) -> bool:
        """Some request whose follow stage has started has no audio yet."""
        return any(r.speech.chunk == 0 and r.speech.ended is None and r.speech.prompt is not None for r in reqs)

    def first_chunk_ready(self, reqs: list) -> bool:
        """Some request's first chunk can run, or can once the follow step in flight is read."""
        return any(r.speech.chunk == 0 and self._chunk_ready(r.speech, 0 if r.speech.ended else r.speech.flying)
                   for r in reqs)

    def schedule_chunks(self, reqs: list, defer: bool = False) -> SpeechStep | None:
        """Ready chunks, first chunks first, then urgent ones, then by arrival, in the walk of the shortest slot
        that holds the first of them (a slot costs its full length: first audio is not decoded in long slots).
        defer: None where no ready chunk is urgent and they fill less than that walk's step (another lane runs)."""
        now, ready = time.perf_counter(), []
        for r in sorted(reqs, key=lambda r: (r.speech.chunk > 0, not self.urgent(r, now))):
            n = self._chunk_ready(r.speech)
            if n:
                a = r.speech.decoded
                ready.append((r, self.sh.slot(a, a + n), a + n))
        if not ready:
            return None
        frames, walk, seqs = self._walk_holding(ready[0][1].frames)
        filled = [c for c in ready if c[1].frames <= frames][:seqs]
        if defer and len(filled) < seqs and not self.urgent(ready[0][0], now):
            return None
        step = SpeechStep(walk, [r for r, _, _ in filled], {self.chunk.node: len(filled) * frames})
        step.data = (filled, frames)
        return step

    def _walk_holding(self, frames: int) -> tuple[int, str, int]:
        """The chunk walk of the shortest slot that holds `frames` (its slot frames, name, slots a step)."""
        for w in self.chunk_walks:
            if w[0] >= frames:
                return w
        raise RuntimeError(f"the model's Speech.slot asked for a {frames}-frame slot, but the longest slot of stage "
                           f"{self.chunk.name}'s walks holds {self.chunk_walks[-1][0]}: a model's chunk_frames and "
                           f"slot must stay within its ChunkStage.slot_frames ({self.chunk.slot_frames})")

    def run_chunks(self, step: SpeechStep) -> list:
        node = self.chunk.node
        rung = step.rungs.get(node)
        slots_of, frames = step.data
        slots = (rung or step.sizes[node]) // frames
        filled = [(torch.tensor(r.speech.frames, dtype=torch.int64).T, slot) for r, slot, _ in slots_of]
        inputs, layouts = self.sh.chunk_inputs(filled, slots, frames)
        out = self.executor.run_node(node, step.walk, rung, slots * frames, inputs, layouts)
        wav = out["wav"].view(slots, -1)[:len(filled)].float().cpu().numpy()
        now = time.perf_counter()
        for i, (r, slot, end) in enumerate(slots_of):
            s = r.speech
            s.audio.append(wav[i, slot.keep_start:slot.keep_stop].copy())
            s.decoded, s.chunk = end, s.chunk + 1
            s.sent.append(now)
            r.times.setdefault("first_audio", now)
        return [r for r, _, _ in slots_of]


@dataclass
class _FollowFlight:
    """A launched follow step: the requests that emit a frame, in order, and their codes' copies to the host."""

    emit: list
    host: tuple
    done: object = None


@dataclass
class _FollowBatch:
    """A follow step being filled: its row parts, sample rows, the text each sample speaks, ragged
    layouts (rows a sequence adds, its rows after the step, its pages), what it serves and who emits."""

    parts: list = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    trailing: list[int] = field(default_factory=list)
    qo: list[int] = field(default_factory=list)
    kv: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    served: list = field(default_factory=list)
    emit: list = field(default_factory=list)
    rows: int = 0

    def add(self, req, part, n: int, token: int | None) -> None:
        s = req.speech
        self.parts.append(part)
        self.rows += n
        self.qo.append(n), self.kv.append(s.computed + n), self.tables.append(s.pages)
        self.served.append((req, n))
        if token is not None:
            self.samples.append(self.rows - 1)
            self.trailing.append(token)
            self.emit.append(req)


def stall_s(sent: list[float], samples: list[int], rate: int) -> float:
    """Seconds a listener who starts playing at the first chunk waits for later ones: chunk k made at sent[k]
    with samples[k] samples, played at `rate` after the audio before it."""
    waited, end = 0.0, None
    for t, n in zip(sent, samples):
        if end is not None and t > end:
            waited += t - end
        end = max(t, end if end is not None else t) + n / rate
    return waited
