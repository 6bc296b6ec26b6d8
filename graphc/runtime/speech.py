"""Speech out: the talker and the vocoder beside the thinker, as planned walks.

A speaking request kind ends in a group of walks run side by side (Qwen3-Omni's t2s and a2s:
thinker_decode, talker_prefill, talker_decode, code2wav_chunk). The thinker decodes the request's text
as any text request; the talker starts as soon as the text it needs exists and emits one codec frame
per step; the vocoder turns frames into audio in chunks as soon as a chunk's frames exist. The engine
runs one walk a step, taking the three lanes (thinker, talker, vocoder) in turn, so a request's first
audio does not wait for its text to end, nor other requests' text for its audio.

What is model-specific (the talker's prompt rows and inputs, the text it speaks next, how frames end
and chunks are cut) comes from the model host's `speech` (SpeechHost below); the lane schedules rows,
pages and rungs, and runs the steps.

Talker rows: a request's talker prompt (T rows), then one row per frame after the first: frame k is
sampled at row T - 1 + k, and a decode step feeds row T + k - 1 (the previous frame's next_embeds) to
emit frame k. Pages grow with the rows; a request whose next row finds the pool empty waits a step
(the talker's rows are small: 20 KiB a row for the real talker). A talker step copies its codes to the
host once (one sync a step for every request in it), to know which requests ended.

Sampling: each request's parameters (SpeechParams, the model's defaults where it names none) become one
row of the talker's `sampling` input; the talker samples inside its (captured) step. Beside each step the
lane draws every sampling row's random numbers on the device (`noise`, Exp(1)), from the request's own
generator when it has a seed, so its frames do not depend on what else runs, else from the lane's shared
one; and it keeps each request's `seen` mask (the first codes it generated, for the repetition penalty)
on the device, updated from the step's codes without a host read. Greedy requests draw nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import Field

from graphc.errors import InvalidInput
from graphc.strict import Strict
from resources.paged_kv import PagedKVSpec


class SpeechSampling(Strict):
    """How the talker picks a frame's first code (temperature 0: greedy, and the other codes greedy too;
    top_k 0: every id; repetition_penalty over the request's earlier first codes). A model's host says its
    defaults (SpeechHost.sampling)."""

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SpeechParams(Strict):
    """A request's speech: the voice (the model's default when None), the most codec frames, and the
    frames of its first audio chunk (the model's default when None; later chunks double, up to a slot).
    A smaller first chunk is heard sooner; speech that fits the first chunk is decoded in one piece.
    Sampling (SpeechSampling's fields; None: the model's default, for Qwen3-Omni HF's temperature 0.9,
    top_k 50, top_p 1.0, repetition_penalty 1.05; temperature 0 is greedy); seed: the request draws from
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
class TalkerPrompt:
    """A request's talker prompt: rows, positions [P, rows], the delta decode rows continue at, and its
    per-row prompt inputs by talker port. empty: the request has nothing to say."""

    rows: int
    positions: torch.Tensor
    delta: int
    inputs: dict[str, torch.Tensor]
    empty: bool = False

    @classmethod
    def silent(cls) -> "TalkerPrompt":
        return cls(0, torch.zeros(3, 0, dtype=torch.int64), 0, {}, empty=True)

    def positions_of(self, start: int, end: int) -> torch.Tensor:
        if end <= self.rows:
            return self.positions[:, start:end]
        return torch.arange(start + self.delta, end + self.delta).expand(self.positions.shape[0], -1)


class SpeechHost:
    """What a speaking model's host provides (models/components/speech_host.py is Qwen3-Omni's).

    talker, vocoder: nodes; prefill_walk, decode_walk: the talker's walks; chunk_walks: the vocoder's,
    walk name -> the frames of its slots (a chunk is decoded in a slot that holds it); voices: name -> the
    model's speaker id; default_voice; sample_rate; hidden_port: the LLM output read at hidden_rows().
    sampling: the model's default SpeechSampling; sampling_row(SpeechSampling) -> the talker's `sampling`
    row; noise_shape: a frame's random draws (the `noise` row); seen_size: the `seen` row's width;
    seen_codes(codes [n, G]) -> [n, 1] the ids a frame adds to `seen`.
    bind(modules, device); check(prompt) refuses a prompt that cannot be spoken;
    talker_prompt(prompt, output, text_done, voice, hidden) -> TalkerPrompt, or None until the text it
    needs exists; trailing(prompt, output, text_done, frame) -> the token id whose embedding frame
    `frame` adds, or None until known; embed(ids) -> their LLM embeddings [n, H];
    talker_inputs(parts, samples, trailing, prefill, sampling, noise, seen) -> a step's inputs;
    talker_layouts(samples) -> ragged layouts; is_end(codes) -> the frame ends the speech;
    chunk_frames(index, first) -> new frames of a request's index-th chunk; first_chunk: its default;
    slot(start, end) -> its Slot (.frames: the slot length it needs); vocoder_inputs(filled, slots,
    slot_frames) -> (inputs, layouts) of a step of `slots` slots; wav of a step: slot after slot."""

    voices: dict[str, int] = {}
    default_voice: str = ""
    sample_rate: int = 24000
    sampling: SpeechSampling = SpeechSampling()


@dataclass
class SpeechState:
    voice: str
    max_frames: int | None
    first_chunk: int
    sampling: torch.Tensor                     # the talker's `sampling` row, on the device
    greedy: bool
    seen: torch.Tensor                         # [seen_size] bool on the device: first codes generated so far
    generator: torch.Generator | None = None   # the request's own (seeded) noise generator
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)   # LLM hidden rows the talker prompt reads
    hidden_rows: set[int] | None = None        # which rows those are (the host's, kept)
    prompt: TalkerPrompt | None = None
    pages: list[int] = field(default_factory=list)
    computed: int = 0                          # talker rows with K/V in pages
    frames: list[list[int]] = field(default_factory=list)
    next_embed: torch.Tensor | None = None     # the talker's next input row, on the device
    ended: str | None = None                   # why the talker stopped: 'stop' (its end code), 'length'
    vocoded: int = 0                           # frames already turned into audio
    chunk: int = 0                             # chunks sent
    audio: list[np.ndarray] = field(default_factory=list)
    text_done: bool = False

    @property
    def done(self) -> bool:
        return self.ended is not None and self.vocoded == len(self.frames)


@dataclass
class SpeechStep:
    walk: str
    reqs: list                                 # the requests it serves, in order
    sizes: dict[str, int]
    rungs: dict[str, int | None] = field(default_factory=dict)
    data: Any = None


class SpeechLane:
    def __init__(self, speech: SpeechHost, executor, boot, seed: int = 0):
        """seed: the shared noise generator's, for requests without their own."""
        self.sh, self.executor = speech, executor
        model = boot.ir.model
        self.model = model
        self.kv_role, kv_res = next((role, r) for role, r in model.node(speech.talker).resources.items()
                                    if isinstance(model.resource(r), PagedKVSpec))
        self.kv: PagedKVSpec = model.resource(kv_res)
        self.pages = executor.pools[kv_res]            # on the talker's device, or kept here for its worker
        self.capacity = self.pages.num_pages - executor.reserved.get(kv_res, 0)
        self.prefill_budget = model.walk(speech.prefill_walk).budget.axes()
        self.decode_seqs = model.walk(speech.decode_walk).budget.seqs
        # the vocoder's walks, shortest slot first: (slot frames, walk, slots a step)
        self.chunk_walks = sorted((n, w, model.walk(w).budget.seqs) for w, n in speech.chunk_walks.items())
        self.device = boot.device
        self.shared = torch.Generator(device=self.device).manual_seed(seed)
        self.no_noise = torch.zeros(speech.noise_shape, device=self.device)
        self.nothing_seen = torch.zeros(speech.seen_size, dtype=torch.bool, device=self.device)
        self.greedy_row = torch.zeros(len(speech.sampling_row(SpeechSampling())), device=self.device)

    def new_state(self, params: SpeechParams | None) -> SpeechState:
        params = params or SpeechParams()
        voice = (params.voice or self.sh.default_voice).lower()
        if voice not in self.sh.voices:
            raise InvalidInput(f"unknown voice '{params.voice}'", f"this model speaks with: "
                               f"{', '.join(sorted(self.sh.voices))}", "pick one of those voices", param="voice")
        sampling = params.sampling(self.sh.sampling)
        gen = (torch.Generator(device=self.device).manual_seed(params.seed)
               if params.seed is not None and not sampling.greedy else None)
        return SpeechState(voice=voice, max_frames=params.max_frames,
                           first_chunk=params.first_chunk or self.sh.first_chunk, sampling=self._row(sampling),
                           greedy=sampling.greedy, seen=self.nothing_seen, generator=gen)

    def _row(self, sampling: SpeechSampling) -> torch.Tensor:
        return torch.tensor(self.sh.sampling_row(sampling), dtype=torch.float32, device=self.device)

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

    # ---- the talker
    def _prepare(self, req) -> None:
        s = req.speech
        if s.prompt is not None or s.ended:
            return
        tp = self.sh.talker_prompt(req.prompt, req.output, s.text_done, s.voice, s.hidden)
        if tp is None:
            return
        s.prompt = tp
        req.times["talker_prompt"] = time.perf_counter()
        if tp.empty:
            s.ended = "stop"
            return
        most = self.kv.max_seq_len - tp.rows + 1
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
        """The token the request's next frame speaks, when its next decode row can run."""
        s = req.speech
        if s.prompt is None or s.ended or s.computed != s.prompt.rows + len(s.frames) - 1 or not s.frames:
            return None
        return self.sh.trailing(req.prompt, req.output, s.text_done, len(s.frames))

    def schedule_talker(self, reqs: list) -> SpeechStep | None:
        for r in reqs:
            self._prepare(r)
        live = [r for r in reqs if r.speech.prompt is not None and not r.speech.ended]
        prefilling = [r for r in live if r.speech.computed < r.speech.prompt.rows]
        decode = []
        for r in live:
            if r in prefilling:
                continue
            t = self._decode_ready(r)
            if t is not None:
                decode.append((r, t))
        if not prefilling and not decode:
            return None
        if prefilling:
            walk, tokens, seqs = self.sh.prefill_walk, self.prefill_budget["tokens"], self.prefill_budget["seqs"]
        else:
            walk, tokens, seqs = self.sh.decode_walk, self.decode_seqs, self.decode_seqs
        parts, samples, trailing, served, qo, kv, tables, emit = [], [], [], [], [], [], [], []
        rows = 0

        def add(req, part, n, t):
            nonlocal rows
            s = req.speech
            parts.append(part)
            rows += n
            qo.append(n), kv.append(s.computed + n), tables.append(s.pages)
            served.append((req, n))
            if t is not None:
                samples.append(rows - 1)
                trailing.append(t)
                emit.append(req)

        for r, t in decode:
            if len(served) >= (seqs - 1 if prefilling else seqs) or rows >= tokens - (1 if prefilling else 0):
                break
            s = r.speech
            if not self._grow(s, s.computed + 1):
                continue
            add(r, ("decode", s.next_embed, s.computed + s.prompt.delta), 1, t)
        for r in prefilling:
            if len(served) >= seqs or rows >= tokens:
                break
            s = r.speech
            n = min(s.prompt.rows - s.computed, tokens - rows)
            if not self._grow(s, s.computed + n):
                continue
            t = None
            if s.computed + n == s.prompt.rows:
                t = self.sh.trailing(r.prompt, r.output, s.text_done, 0)
                if t is None:                     # its first frame's text is not known yet: stop short of it
                    n -= 1
                    if n == 0:
                        continue
            add(r, ("prompt", s.prompt, s.computed, s.computed + n), n, t)
        if not served:
            return None
        real = len(samples)
        if not samples:                           # a step of partial prompts still runs one (discarded) sample
            samples.append(rows - 1)
            trailing.append(self.sh.trailing_pad)
        trailing = list(self.sh.embed(trailing))  # one lookup for the step's rows
        step = SpeechStep(walk, [r for r, _ in served], {self.sh.talker: rows})
        step.data = (parts, samples, trailing, qo, kv, tables, emit[:real], served)
        return step

    def run_talker(self, step: SpeechStep) -> None:
        parts, samples, trailing, qo, kv, tables, emit, served = step.data
        rung = step.rungs.get(self.sh.talker)
        seqs = len(samples)
        if rung is not None and self.executor.gpu is not None:
            seqs = self.executor.steps[(self.sh.talker, step.walk)].sizes_at(rung)["seqs"]
        sampling, noise, seen = self._sampling_inputs(emit, len(samples))
        inputs = self.sh.talker_inputs(parts, samples, trailing, step.walk == self.sh.prefill_walk, sampling, noise,
                                       seen)
        layouts = {self.kv_role: (qo, kv, tables), **self.sh.talker_layouts(seqs)}
        out = self.executor.run_node(self.sh.talker, step.walk, rung, step.sizes[self.sh.talker], inputs, layouts)
        for req, n in served:
            req.speech.computed += n
        if emit:                                  # each request's seen ids, on the device
            seen = seen[:len(emit)].scatter(1, self.sh.seen_codes(out["codes"][:len(emit)]), True)
            for i, req in enumerate(emit):
                req.speech.seen = seen[i]
        codes = out["codes"][:len(emit)].tolist() if emit else []
        for i, req in enumerate(emit):
            s = req.speech
            if self.sh.is_end(codes[i]):
                s.ended = "stop"
            else:
                s.frames.append(codes[i])
                if len(s.frames) == 1:
                    req.times["first_frame"] = time.perf_counter()
                s.next_embed = out["next_embeds"][i].clone()
                if len(s.frames) >= s.max_frames:
                    s.ended = "length"
            if s.ended:
                self.release(s)

    # ---- the vocoder
    def _chunk_ready(self, s: SpeechState) -> int:
        """New frames of the request's next chunk when it can run now, else 0."""
        have = len(s.frames) - s.vocoded
        n = self.sh.chunk_frames(s.chunk, s.first_chunk)
        return min(n, have) if have > 0 and (have >= n or s.ended) else 0

    def talker_urgent(self, reqs: list) -> bool:
        """Some request whose talker has started has no audio yet."""
        return any(r.speech.chunk == 0 and r.speech.ended is None and r.speech.prompt is not None for r in reqs)

    def first_chunk_ready(self, reqs: list) -> bool:
        return any(r.speech.chunk == 0 and self._chunk_ready(r.speech) for r in reqs)

    def schedule_vocoder(self, reqs: list) -> SpeechStep | None:
        """Ready chunks, first chunks first, then by arrival, in the walk of the shortest slot that holds
        the first of them (a slot costs its full length: first audio is not decoded in long slots)."""
        ready = []
        for r in sorted(reqs, key=lambda r: r.speech.chunk > 0):
            n = self._chunk_ready(r.speech)
            if n:
                a = r.speech.vocoded
                ready.append((r, self.sh.slot(a, a + n), a + n))
        if not ready:
            return None
        frames, walk, seqs = next(w for w in self.chunk_walks if w[0] >= ready[0][1].frames)
        filled = [c for c in ready if c[1].frames <= frames][:seqs]
        step = SpeechStep(walk, [r for r, _, _ in filled], {self.sh.vocoder: len(filled) * frames})
        step.data = (filled, frames)
        return step

    def run_vocoder(self, step: SpeechStep) -> list:
        node = self.sh.vocoder
        rung = step.rungs.get(node)
        slots_of, frames = step.data
        slots = (rung or step.sizes[node]) // frames
        filled = [(torch.tensor(r.speech.frames, dtype=torch.int64).T, slot) for r, slot, _ in slots_of]
        inputs, layouts = self.sh.vocoder_inputs(filled, slots, frames)
        out = self.executor.run_node(node, step.walk, rung, slots * frames, inputs, layouts)
        wav = out["wav"].view(slots, -1)[:len(filled)].float().cpu().numpy()
        now = time.perf_counter()
        for i, (r, slot, end) in enumerate(slots_of):
            s = r.speech
            s.audio.append(wav[i, slot.keep_start:slot.keep_stop].copy())
            s.vocoded, s.chunk = end, s.chunk + 1
            r.times.setdefault("first_audio", now)
        return [r for r, _, _ in slots_of]
