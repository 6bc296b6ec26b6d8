"""graphc.Engine: boots a plan and serves its request kinds (the Python API `graphc run` uses).

    engine = Engine("plans/tiny_cpu.plan", random_weights=True)     # or checkpoint="ckpt/"
    outs = engine.generate([{"messages": [...], "max_tokens": 32}, {"prompt_token_ids": [...]}])

One thread drives it: add() requests, step() until they finish (generate() does both). The server
calls the same methods from its engine thread.
"""
from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from graphc.errors import InvalidInput
from graphc.hostmem import check_host_memory
from graphc.plan import Plan, check_servable, load_plan
from graphc.serving import Host, Media
from graphc.runtime.boot import boot_plan
from graphc.runtime.check import compare, verdict
from graphc.runtime.executor import Executor, llm_node, scratch_pages, text_kind
from graphc.runtime.flight import Flight, placeholder
from graphc.runtime.progress import BootProgress
from graphc.runtime.grammar import Grammars, Guide, step_mask
from graphc.runtime.prefix_cache import media_digests
from graphc.runtime.request import Request
from graphc.runtime.sampler import Sampler, SamplingParams, needs_history, new_generator, score
from graphc.runtime.follow_rows import follow_rows
from graphc.runtime.scheduler import Scheduler, StepPlan
from graphc.runtime.speech import SpeechLane, SpeechParams, stall_s
from graphc.runtime.workers import WorkerDied, device_memory
from graphc.source import first_difference, read_config


@dataclass
class Output:
    """What one request produced."""

    id: str
    kind: str
    prompt_tokens: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    logprobs: list[dict] | None = None
    prompt_logprobs: list[dict | None] | None = None      # per prompt token (the first None), when asked
    error: str | None = None
    times: dict[str, float] = field(default_factory=dict)
    audio: Any = None                  # float32 samples in [-1, 1] at sample_rate, when it spoke
    sample_rate: int | None = None
    audio_codes: list[list[int]] | None = None     # the codec frames the audio was made from
    audio_finish_reason: str | None = None         # why the speech ended: stop (its end code) or length
    audio_path: str | None = None                  # where graphc run wrote it (offline)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if v is not None and k not in ("audio", "audio_codes")}
        if self.audio_codes is not None:
            out["audio_frames"] = len(self.audio_codes)
            out["audio_seconds"] = len(self.audio) / self.sample_rate
        return out


@dataclass
class Event:
    """A step's news for one request: new tokens, the text they released, and whether it finished."""

    request: Request
    token_ids: list[int]
    text: str
    finished: bool
    audio: Any = None                  # new float32 samples (speech), or None


@dataclass
class Admission:
    """A request prepared (Engine.prepare, any thread), not yet admitted (Engine.admit, the engine's thread)."""

    req: Request
    speech: SpeechParams | None
    speak: list[int] | None


class Engine:
    def __init__(self, plan: str | Path | Plan, checkpoint: str | Path | None = None, *, random_weights: bool = False,
                 seed: int = 0, emulate: bool = False, force: bool = False, prebuild: bool = True, boot=None,
                 links: dict | None = None, host: str = "127.0.0.1", replica: int = 0, prefix_cache: bool = True,
                 overlap: bool = True, default_max_tokens: int | None = None, chat_template: str | None = None, tokenizer=None,
                 audio_lead_ms: float | None = None):
        """boot: serve an already booted DeviceBoot of this plan (tests run one plan's weights on two devices).
        replica: which copy of a plan of several replicas this engine serves, on GPU `replica` (graphc/runtime/
        replicas.py starts one engine per replica). prefix_cache: share the LLM's full text pages across requests by
        content (graphc/runtime/prefix_cache.py; plans with state slots never do). chat_template: a template file or
        text that renders chat requests instead of the text folder's. tokenizer: a folder whose tokenizer.json and
        chat template replace the checkpoint's (seeded weights too; chat.text_folder). default_max_tokens: the most
        a request that names no max_tokens generates (None: what the plan's context leaves after its prompt).
        overlap: launch each LLM step before reading the one before it back (graphc/runtime/flight.py); never where
        the LLM runs on another device than this process's. links: the other devices' workers when something else
        started them (Ray actors, ray_run.py; this process then sees only its own GPU), else a worker process each
        is started; host: this process's address as those workers reach it. audio_lead_ms: a speaking request's
        later audio chunks may wait, while another lane has a step, as long as its audio leads playback by more
        than this (speech.py SpeechLane; None: none waits)."""
        self.default_max_tokens, self.audio_lead_ms = default_max_tokens, audio_lead_ms
        self.text_folder, given = check_options(checkpoint, random_weights, default_max_tokens, chat_template,
                                                tokenizer, audio_lead_ms)
        self.plan = plan if isinstance(plan, Plan) else load_plan(plan)
        check_servable(self.plan)
        self.tokenizer, self.template = self._text_tools(given)
        if links is None:                                  # devices in this host's memory fit what it has
            check_host_memory(self.plan)
        check_checkpoint(self.plan, checkpoint)
        progress = BootProgress(f"replica {replica}" if self.plan.replicas > 1 else "")      # its lines: progress.py
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.llm = llm_node(self.plan)
        opts = dict(checkpoint=self.checkpoint, seed=seed, emulate=emulate, force=force, prebuild=prebuild)
        self.workers = self.ranks = None
        self.boot = boot if boot is not None else self._boot(opts, links, host, replica, progress)
        self.model = self.boot.ir.model
        self.host = self._host()
        kv_res = next(r for r in self.model.node(self.llm).resources.values() if r in self.boot.pages)
        # a captured paged rung runs exactly its sequences and rows: padding sits on one scratch page of each pool
        scratch = scratch_pages(self.boot)
        if self.ranks is not None:
            self.ranks.agree(scratch)
        self.executor = Executor(self.boot, self.host, self.llm, scratch, self.workers, self.ranks)
        self.scheduler = Scheduler(self.plan, self.model, self.llm, self.executor.kv_spec, self.boot.pages[kv_res],
                                   reserved=self.executor.reserved.get(kv_res, 0),
                                   slots={r: self.boot.slots[r] for r in self.model.node(self.llm).resources.values()
                                          if r in self.boot.slots}, prefix_cache=prefix_cache)
        self.overlap = overlap and self.llm in self.boot.nodes
        self.speech, self.speech_refused = self._speech_lane(seed)
        self.talking: list[Request] = []          # speaking requests not closed, in arrival order
        self._lane = 0
        self.sampler = Sampler(seed, self.boot.device)
        self.inflight: Flight | None = None       # the LLM step launched and not yet read back
        self._grammars: Grammars | None = None    # built at the first guided request (xgrammar imports slowly)
        self._grammar_lock = threading.Lock()     # the server compiles guides in worker threads
        self._ids = itertools.count()
        self.requests: dict[str, Request] = {}
        self.dead: str | None = None              # why the engine stopped (a worker died)
        self.devices = self._verdicts()
        self.boot_seconds = progress.done()

    def _verdicts(self) -> dict:
        """Each plan device's boot against its ledger (its peak, its graphs), this device's and the workers'."""
        devices = {self.boot.index: verdict(compare(self.boot))}
        if self.workers is not None:
            devices |= self.workers.checks
        if self.ranks is not None:                # rank r's device: the plan's one ledger, on GPU r
            devices |= self.ranks.checks
        return dict(sorted(devices.items()))

    def _boot(self, opts: dict, links: dict | None, host: str, replica: int, progress: BootProgress):
        """This process's device, booted: with a worker process for each other plan device, or a process for
        each other tensor-parallel rank, or on GPU `replica` (a replica of several), or alone."""
        if len(self.plan.devices) > 1:
            self.workers = self._start_workers(opts, links, host, progress)
            return self.workers.booted
        if self.plan.tensor_parallel > 1:
            self.ranks = self._start_ranks(opts, host, progress)
            return self.ranks.booted
        return boot_plan(self.plan, gpu=replica if self.plan.replicas > 1 else None, progress=progress, **opts)[0]

    def _start_workers(self, opts: dict, links: dict | None, host: str, progress: BootProgress):
        """A worker for each plan device but the LLM's (this process boots that one, reporting to progress)."""
        from graphc.runtime.workers import Workers

        local = next(d.index for d in self.plan.devices if self.llm in d.nodes)
        gpu = 0 if links is not None else local

        def boot_local():
            return boot_plan(self.plan, devices=[local], gpu=gpu, progress=progress, **opts)[0]

        device = torch.device("cpu" if self.plan.target.arch == "cpu" else f"cuda:{gpu}")
        return Workers(self.plan, local, device, boot_local, links=links, host=host, progress=progress, **opts)

    def _start_ranks(self, opts: dict, host: str, progress: BootProgress):
        """A process for each tensor-parallel rank but 0, which this process boots (reporting to progress)."""
        from graphc.runtime.tensor_parallel import Ranks

        def boot_local():
            return boot_plan(self.plan, rank=0, progress=progress, **opts)[0]

        return Ranks(self.plan, boot_local, opts, host, progress)

    def _speech_lane(self, seed: int) -> tuple[SpeechLane | None, str | None]:
        """The pipeline's follow and chunk stages, when the model's host speaks and the plan has a speaking
        kind; else None, and why not when the plan placed their nodes where the engine cannot drive them."""
        sh, pipe = self.host.speech, self.plan.pipeline
        if sh is None or pipe.follow is None or not self._speech_kinds():
            return None, None
        linked = {ln.dst for ln in self.model.links if ln.src == self.llm}
        away = [n for n in (pipe.follow.node, pipe.chunk.node) if n not in self.boot.nodes and n not in linked]
        if away:                  # each must be here, or on a worker that the engine drives through a declared link
            return None, (f"the plan puts {' and '.join(away)} on another device than {self.llm}, and the model "
                          f"declares no link from {self.llm} to {away[0]} (its inputs are made on {self.llm}'s "
                          f"device); declare a graphc Link, or plan with --set nodes.{away[0]}.device=N on "
                          f"{self.llm}'s device")
        sh.bind(self.boot.modules, self.boot.device)
        overlap = self.overlap and pipe.follow.node in self.boot.nodes
        if self.scheduler.shared is not None:         # the follow stage's LLM rows of cached pages
            self.scheduler.follow = follow_rows(self.boot, self.llm)
        return SpeechLane(pipe, sh, self.executor, self.boot, seed=seed, overlap=overlap,
                          lead_ms=self.audio_lead_ms), None

    def _text_tools(self, given):
        """(tokenizer, chat template) of the text folder (graphc/runtime/chat.py text_folder), each None where it
        has none; given: the --chat-template. A tokenizer with ids past the LLM's vocabulary is refused before
        boot (the plan's declaration says the LLM's rows)."""
        from graphc.runtime.chat import check_vocabulary, load_text

        tokenizer, template = load_text(self.text_folder, given)
        if tokenizer is not None:
            check_vocabulary(tokenizer, vocab_rows(self.plan), self.text_folder)
        return tokenizer, template

    # ---- boot facts
    def _host(self) -> Host:
        make = getattr(self.boot.module, "host", None)
        if not callable(make):
            raise InvalidInput(f"{self.plan.model.file} declares no host(model, checkpoint)",
                               "graphc run builds prompts and encoder steps through the model file's host",
                               "add a host() to the model file (graphc/serving.py says what it returns)")
        host = make(self.model, self.checkpoint)
        if self.tokenizer is not None:                     # the host's text (a video's times) in the engine's ids
            host.use_tokenizer(self.tokenizer)
        return host

    def summary(self) -> str:
        kv = self.executor.kv_spec
        pages = self.scheduler.capacity
        graphs = " + ".join(str(c["graphs_captured"]) for c in self.devices.values())
        n = len(self.plan.devices) * self.plan.tensor_parallel
        where = (f"{self.boot.device.type}" if self.boot.device.type == "cpu" else self.plan.target.gpu) + f" x{n}"
        if self.workers is not None:
            where += f" ({self.workers.kind} for devices {', '.join(map(str, self.workers.links))})"
        if self.ranks is not None:
            where += " (tensor-parallel ranks)"
        unit = "rank" if self.ranks is not None else "device"
        line = (f"graphc run: {self.plan.model.name} on {where}, {graphs} graphs captured"
                f"{' (CPU: every step eager)' if not self.boot.graphs else ''}, {pages * kv.page_size:,} KV tokens "
                f"({pages:,} pages), kinds {', '.join(self.kinds())}, booted in {self.boot_seconds:.1f} s")
        return line + "".join("\n" + self.ledger_line(d, c, unit) for d, c in self.devices.items()
                              if c["measured"] is not None or c["missing_graphs"])

    @staticmethod
    def ledger_line(d: int, c: dict, unit: str = "device") -> str:
        """A device's (or a tensor-parallel rank's) boot against its ledger: its peak, its graphs, and where it
        breaks the plan's word."""
        line = f"  {unit} {d}: {c['graphs_captured']} of {c['graphs_planned']} graphs captured"
        if c["measured"] is not None:
            line += (f", peak {c['measured'] / 1e9:.3f} GB of {c['planned'] / 1e9:.3f} GB planned "
                     f"({100 * c['within']:+.2f}%)")
        if not c["ok"]:
            why = [f"missing {', '.join(c['missing_graphs'][:3])}"] if c["missing_graphs"] else []
            why += ["its peak is over the ledger's tolerance or the card"] if c["measured"] is not None else []
            line += " -- NOT AS PLANNED: " + "; ".join(why) + " (graphc check on this plan says which line)"
        return line

    def device_memory(self) -> dict[int, dict]:
        """What each plan device's GPU holds now (NCCL's buffers included) and the most torch reserved
        since boot; from the engine's thread, between steps."""
        out = {self.boot.index: device_memory(self.boot.device)}
        if self.workers is not None and self.dead is None:
            out |= self.workers.memory()
        return dict(sorted(out.items()))

    def _speech_kinds(self) -> list[str]:
        """Kinds that end in a group of walks holding the LLM's decode walk (text and speech out)."""
        decode = self.scheduler.decode_walk
        return [k for k, stages in self.plan.requests.items()
                if not text_kind(stages) and text_kind(stages[:-1]) and decode in stages[-1]]

    def kinds(self) -> list[str]:
        return ([k for k, stages in self.plan.requests.items() if text_kind(stages)]
                + (self._speech_kinds() if self.speech is not None else []))

    # ---- requests
    def _kind(self, walks: set[str], speech: bool = False) -> tuple[str, list[str], str]:
        decode = self.scheduler.decode_walk
        names = self._speech_kinds() if speech else [k for k, st in self.plan.requests.items() if text_kind(st)]
        for name in names:
            stages = self.plan.requests[name]
            prefill = [s for s in (stages[:-1] if speech else stages) if s != decode]
            encoders = {w for w in prefill if self.scheduler.encoder.get(w)}
            if encoders == walks:
                return name, prefill, decode
        media = " and ".join(sorted(walks)) or "text only"
        out = "text and speech" if speech else "text"
        raise InvalidInput(f"no request kind of this plan takes {media} with {out} out",
                           f"its kinds: {', '.join(self.kinds()) or 'none'}",
                           "send the inputs one of those kinds takes" if names else
                           "ask for text out (this plan declares no speaking kind)", param="modalities")

    def media_limits(self):
        """inputs.Limits: the longest audio and video a prompt of this plan can hold (the host's bound on
        its rows against the KV pool's max_seq_len), refused before decoding."""
        from graphc.runtime.inputs import Limits

        most = self.executor.kv_spec.max_seq_len
        seconds, frames = self.host.media_limits(most)
        return Limits(seconds, frames, f"a prompt of this plan holds at most {most:,} rows", self.host.video_frames)

    def tokenize(self, messages: list[dict] | None = None, prompt: str | None = None,
                 template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                 chat_template: str | None = None) -> list[int]:
        """The token ids of a prompt, or of messages as the chat template renders them (with template_kwargs,
        the template's own variables, in scope); chat_template: a request's own template text instead of the
        engine's, with the checkpoint's special tokens."""
        if self.tokenizer is None:
            raise InvalidInput("this engine has no tokenizer", "it was started without a tokenizer.json",
                               "send prompt_token_ids, or start it with --tokenizer DIR (or --checkpoint DIR) "
                               "holding tokenizer.json")
        if messages is not None:
            template = self.template
            if chat_template is not None:
                from graphc.runtime.chat import ChatTemplate
                template = ChatTemplate(chat_template, template.special if template is not None else None)
            if template is None:
                raise InvalidInput(f"{self.text_folder} has no chat template", "", "send prompt or prompt_token_ids")
            prompt = template.render(messages, add_generation_prompt, variables=template_kwargs)
        return self.tokenizer.encode(prompt, add_special_tokens=False).ids

    def add(self, **kwargs) -> Request:
        """A new request, prepared (prepare: its arguments) and admitted, in this thread."""
        return self.admit(self.prepare(**kwargs))

    def prepare(self, *, prompt_token_ids: list[int] | None = None, messages: list[dict] | None = None,
                prompt: str | None = None, media: list[Media] = (), params: SamplingParams | None = None,
                request_id: str | None = None, user: Any = None, use_audio_in_video: bool = False,
                speech: SpeechParams | None = None, speak: list[int] | None = None, split: bool = False,
                template_kwargs: dict | None = None, chat_template: str | None = None) -> Admission:
        """What a new request needs of no engine state, from any thread (the server prepares each request in a
        worker thread, so that media preprocessing runs in parallel and never holds the engine's steps): its
        prompt ids, its media preprocessed by the model's host, the checks, its Request. admit() then hands it
        to the engine. speech: answer with speech too (a speaking kind: t2s, a2s); its voice and frame limit.
        speak: the answer's text token ids, spoken as given (text to speech): the LLM does not run,
        since the follow stage reads only its embedding table for text rows. split: messages come from
        split_messages already (the server decodes media in its handlers), their media in `media`; else their
        media parts are read here, from any path they name. template_kwargs: the chat template's own variables
        (chat_template_kwargs); chat_template: the request's own template text (--trust-request-chat-template)."""
        params = params or SamplingParams()
        given = [x is not None for x in (prompt_token_ids, messages, prompt)]
        if sum(given) != 1:
            raise InvalidInput("a request needs exactly one of prompt_token_ids, messages and prompt",
                               f"got {sum(given)}", "send one")
        media = list(media)
        if messages is not None and not split:
            from graphc.runtime.inputs import split_messages
            messages, found = split_messages(messages, use_audio_in_video, limits=self.media_limits())
            media += found
        ids = list(prompt_token_ids) if prompt_token_ids is not None else \
            self.tokenize(messages, prompt, template_kwargs, chat_template=chat_template)
        self._check_ids(ids, "prompt token ids")
        self._check_ids([t for t, _ in params.logit_bias], "logit_bias ids")
        rp = self.host.prompt(ids, media)
        if not rp.ids:
            raise InvalidInput("the prompt is empty", "", "send at least one token")
        if speech is not None:
            self._check_speaks()
            self.host.speech.check(rp)
        kind, prefill, decode = self._kind(rp.walks(), speech is not None)
        rid = request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        most = self.executor.kv_spec.max_seq_len
        room = max(most - len(rp.ids), 1)
        max_tokens = params.max_tokens if params.max_tokens is not None else min(room, self.default_max_tokens or room)
        req = Request(id=rid, kind=kind, prefill_walks=prefill, decode_walk=decode, prompt=rp, params=params,
                      max_rows=len(rp.ids) + max_tokens, arrival=-1, max_tokens=max_tokens, user=user)
        req.generator = new_generator(params.seed, self.boot.device) if params.seed is not None else None
        req.detok = self._detokenizer(params)
        req.guide = self.grammars().matcher(params.guide) if params.guide is not None else None
        req.logprobs = [] if params.logprobs else None
        req.prompt_logprobs = [None] if params.prompt_logprobs is not None else None
        if self.scheduler.shared is not None or self.executor.media:     # the caches' keys, off the engine's thread
            req.media_keys = media_digests(rp)
        return Admission(req, speech, speak)

    def admit(self, a: Admission) -> Request:
        """A prepared request into the engine, in the engine's thread: its place in the order of arrival, its
        speech state, the scheduler (or, spoken as given, the speech stages only)."""
        req = a.req
        if req.id in self.requests:
            raise InvalidInput(f"request id {req.id} is in flight", "", "use another id")
        state = self._speech_state(req.prompt, a.speech)
        req.arrival = next(self._ids)
        if a.speak is not None:
            self._spoken_as_given(req, state, a.speak)
        else:
            self.scheduler.add(req)
        if state is not None:
            req.speech = state
            self.talking.append(req)
        self.requests[req.id] = req
        return req

    def _check_ids(self, ids: list[int], what: str) -> None:
        vocab = self.model.node(self.llm).outputs["logits"].shape[-1]
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidInput(f"{what} {bad[:4]} are outside the vocabulary", f"it has {vocab} ids",
                               "tokenize with the model's tokenizer")

    def _speech_state(self, rp, speech: SpeechParams | None):
        """A speaking request's speech state (None for text out), refused where the engine does not speak."""
        if speech is None:
            return None
        self._check_speaks()
        state = self.speech.new_state(speech)
        self.host.speech.check(rp)
        state.hidden_rows = set(self.host.speech.hidden_rows(rp))    # computed, or from the follow cache
        return state

    def _check_speaks(self) -> None:
        """Refuse speech out where the engine does not speak."""
        if self.speech is None:
            raise InvalidInput("this plan does not speak" if self.speech_refused is None else "this engine does not speak",
                               self.speech_refused or f"its kinds: {', '.join(self.kinds())}",
                               "ask for text out only, or plan a model that speaks" if self.speech_refused is None
                               else "plan the speech stages' nodes on the LLM's device (--set nodes.NAME.device=N)",
                               param="modalities")

    def grammars(self) -> Grammars:
        """The engine's grammar compiler (graphc/runtime/grammar.py), built on first use; from any thread."""
        with self._grammar_lock:
            if self._grammars is None:
                if self.tokenizer is None:
                    raise InvalidInput("guided decoding (response_format, tool_choice) needs a tokenizer",
                                       "this engine serves token ids only",
                                       "start it with --tokenizer DIR (or --checkpoint DIR) holding tokenizer.json",
                                       param="response_format")
                width = self.model.node(self.llm).outputs["logits"].shape[-1]
                self._grammars = Grammars(self.tokenizer, width, list(self.host.eos_token_ids))
            return self._grammars

    def compile_guide(self, guide: Guide) -> None:
        """Compile a guide into the engine's cache, or refuse it (InvalidInput): the server calls it in a worker
        thread, so that the engine thread's compile of the same guide is a cache hit."""
        self.grammars().compile(guide)

    def _detokenizer(self, params: SamplingParams):
        if self.tokenizer is not None:
            from graphc.runtime.detok import Detokenizer
            return Detokenizer(self.tokenizer, params.stop)
        if params.stop:
            raise InvalidInput("stop strings need a tokenizer", "this engine serves token ids only",
                               "use stop_token_ids, or start it with --tokenizer DIR or --checkpoint DIR")
        return None

    def _spoken_as_given(self, req: Request, state, speak: list[int]) -> None:
        """Text to speech: the request's text is `speak` and is done; only the speech stages run."""
        if state is None or req.prompt.media:
            raise InvalidInput("speak (text to speech) needs speech out and a text-only prompt",
                               f"speech {'off' if state is None else 'on'}, {len(req.prompt.media)} media items", "")
        if not speak:
            raise InvalidInput("the text to speak is empty", "0 ids", "send some text")
        self._check_ids(speak, "ids to speak")
        end = self.host.eos_token_ids[:1] or [speak[-1]]
        req.output = list(speak) + list(end)           # its end token is never spoken: the host's stand-in takes it
        if req.detok is not None:
            req.detok.add(list(speak))
            req.detok.finish()
        req.finish_reason, state.text_done = "stop", True
        req.times["text_finished"] = req.times["arrived"]

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and not req.closed:
            req.finish_reason = "abort"           # a speaking request's text may have ended: the request did not
            if req.speech is not None and req.speech.ended is None:
                req.speech.ended = "abort"
            self._close(req)

    def close(self) -> None:
        """Stop the plan's worker and rank processes (a one-device engine holds none)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None

    def has_work(self) -> bool:
        return not self.scheduler.idle() or bool(self.talking) or (self.inflight is not None and self.inflight.live())

    # ---- one step
    def step(self) -> list[Event]:
        """One step of one walk: the LLM's, the follow stage's or the chunk stage's lane, taken in turn;
        while a request whose follow stage started has no audio yet, that stage goes first, and a chunk that
        would be some request's first audio before that. Where no lane can run, the follow step in flight is read. A plan device's worker that died fails every request in
        flight and raises WorkerDied (the engine cannot go on)."""
        try:
            if self.workers is not None:
                self.workers.check()
            if self.ranks is not None:
                self.ranks.check()
            return self._step()
        except WorkerDied as e:
            self.dead = str(e)
            e.events = self.fail_all(f"WorkerDied: {e.what}")    # for whoever streams them
            raise

    def fail_all(self, error: str) -> list[Event]:
        """Fail every request in flight with `error` (the engine cannot go on): their finishing events."""
        events, self.inflight = [], None
        if self.speech is not None:
            self.speech.inflight = None
        for req in list(self.requests.values()):
            if not req.closed:
                req.finish_reason, req.error = "error", error
                self._close(req)
                events.append(Event(req, [], "", True))
        return events

    def _step(self) -> list[Event]:
        lanes = ((self._llm_step, self._follow_step, partial(self._chunk_step, True)) if self.speech
                 else (self._llm_step,))
        order = [(self._lane + k) % len(lanes) for k in range(len(lanes))]
        if self.speech is not None:           # first audio first: its chunk, else its follow step, before the rest
            for lane, urgent in ((1, self.speech.follow_urgent(self.talking)),
                                 (2, self.speech.first_chunk_ready(self.talking))):
                if urgent:
                    order.remove(lane)
                    order.insert(0, lane)
        for i in order:
            t0 = time.perf_counter()
            events = lanes[i]()
            if events is not None:
                self._lane = (i + 1) % len(lanes)
                self.scheduler.stats.seconds[self._walk] += time.perf_counter() - t0
                return events
        if self.speech is not None and self.speech.lead_ms is not None:    # no other lane has a step: waiting chunks
            t0 = time.perf_counter()
            if (events := self._chunk_step(False)) is not None:
                self.scheduler.stats.seconds[self._walk] += time.perf_counter() - t0
                return events
        if self.speech is not None and self.speech.inflight is not None:    # no lane can run before its codes
            self.speech.read_follow()
            return self._close_spoken()
        if self.has_work():              # a bookkeeping bug: say so rather than spin forever
            s = self.scheduler
            raise RuntimeError(f"the scheduler holds {len(s.running)} running and {len(s.waiting)} waiting "
                               f"requests and {len(self.talking)} speaking, but no step to run "
                               f"({s.pages.num_free} of {s.capacity} pages free)")
        return []

    def _fail(self, reqs: list[Request], e: Exception) -> list[Event]:
        """A step's requests fail; the engine and the others go on. A dead worker (WorkerDied, from any lane's
        step) is raised on instead: the engine cannot go on, and step() fails everything in flight."""
        if isinstance(e, WorkerDied):
            raise e
        events = []
        for req in reqs:
            if req.closed:
                continue
            req.finish_reason, req.error = "error", f"{type(e).__name__}: {e}"
            if req.speech is not None:
                req.speech.ended = req.speech.ended or "error"
            events.append(self._finish(req))
        return events

    def _follow_step(self) -> list[Event] | None:
        """Launch the follow stage's next step, then read the one in flight before it (its codes were computing
        meanwhile: graphc/runtime/speech.py). Scheduling can end a request's speech before any step (its text
        holds nothing to speak), and a read can end it: close those."""
        lane = self.speech
        with lane.on_lane():
            step = lane.schedule_follow([r for r in self.talking if r.speech.ended is None])
            if step is None:
                return self._close_spoken() or None
            self._count(step)
            try:
                lane.run_follow(step)
            except Exception as e:
                return self._fail(step.reqs, e) + self._close_spoken()
        return self._close_spoken()

    def _close_spoken(self) -> list[Event]:
        """Close the speaking requests whose text and speech are both done (their finishing events)."""
        return [ev for r in list(self.talking) if (ev := self._maybe_close(r)) is not None]

    def _chunk_step(self, defer: bool) -> list[Event] | None:
        """The chunk stage's next step; frames still in flight that a chunk waits for are read first. defer: the
        lane's deferral applies (another lane may run instead)."""
        events = []
        if self.speech.chunk_waits(self.talking, defer):
            self.speech.read_follow()
            events = self._close_spoken()
        step = self.speech.schedule_chunks(self.talking, defer)
        if step is None:
            return events or None
        self._count(step)
        try:
            with self.speech.on_lane():
                served = self.speech.run_chunks(step)
        except Exception as e:
            return events + self._fail(step.reqs, e)
        for r in served:
            ev = self._maybe_close(r) or Event(r, [], "", False)
            ev.audio = r.speech.audio[-1]
            events.append(ev)
        return events

    def _count(self, step) -> None:
        self._walk = step.walk
        plan = StepPlan(step.walk, [], dict(step.sizes), {})
        self.scheduler._count(plan)
        step.rungs = plan.rungs

    def _maybe_close(self, req: Request) -> Event | None:
        s = req.speech
        if s is not None and s.text_done and s.done and not req.closed:
            self._close(req)
            return Event(req, [], "", True)
        return None

    def _llm_step(self) -> list[Event] | None:
        """Launch the LLM's next step, then read the step in flight before it (its tokens were computing while
        this one was built: graphc/runtime/flight.py). A step whose tokens the next one needs on the host
        (penalties, a guide, a remote LLM, overlap off) is read at once, so it is never the one in flight."""
        plan = self.scheduler.schedule()
        if plan is None:
            return self._read() if self.inflight is not None else None
        flight, events = self._launch(plan)
        if self.inflight is not None:
            events = self._read() + events
        self.inflight = flight if flight is not None and flight.live() else None   # else nothing to read
        if self.inflight is not None and not flight.stays:
            events += self._read()
        return events

    def _launch(self, plan: StepPlan) -> tuple[Flight | None, list[Event]]:
        """Run the step and sample on the device; each sampled request's output takes a placeholder."""
        self._walk = plan.walk
        try:
            result = self.executor.run(plan, pending=self.inflight.tokens if self.inflight is not None else None)
        except Exception as e:
            return None, self._fail([c.req for c in plan.chunks], e)
        for c in plan.chunks:
            c.req.computed = c.end
        self._score(plan, result)
        if self.speech is not None:
            self._keep_hidden(plan, result)
        reqs = [c.req for c in plan.chunks if c.sample]
        if not reqs:
            return None, []
        try:                                     # a matcher that cannot mask fails its step's requests, not the engine
            mask = step_mask([r.guide for r in reqs], [len(r.output) for r in reqs], result.logits.shape[-1])
        except RuntimeError as e:
            return None, self._fail(reqs, e)
        sampled = self.sampler(result.logits, [r.params for r in reqs], [r.prompt.ids for r in reqs],
                               [r.output for r in reqs], [r.generator for r in reqs], mask)
        rows = []
        for i, req in enumerate(reqs):
            rows.append((req, len(req.output)))
            req.output.append(placeholder(i))
        flight = Flight.launch(rows, sampled)
        # a guided request's matcher takes its token before its next mask is filled; a speaking request's follow
        # stage reads only the tokens before its placeholder (SpeechLane: a placeholder never reaches its step)
        flight.stays = self.overlap and all(r.guide is None and not needs_history(r.params) for r in reqs)
        return flight, []

    @staticmethod
    def _score(plan: StepPlan, result) -> None:
        """The prompt logprobs of the step's scored rows, read now (only requests that ask have them)."""
        at = 0
        for c in plan.chunks:
            if c.score is not None:
                a, b = c.score
                c.req.prompt_logprobs += score(result.scores[at:at + b - a], c.req.prompt.ids[a + 1:b + 1],
                                               c.req.params.prompt_logprobs)
                at += b - a

    def _read(self) -> list[Event]:
        """Read the step in flight: each live request's token, accepted as if sampled now."""
        flight, self.inflight = self.inflight, None
        events = []
        for req, pos, tok in flight.read():
            events.append(self._accept(req, tok, pos))
        return events

    def _accept(self, req: Request, tok: int, pos: int) -> Event:
        """Token `tok` at output index `pos` (a later placeholder is void when it ends the request: _close drops it)."""
        now = time.perf_counter()
        req.times.setdefault("first_token", now)
        text = req.detok.add([tok]) if req.detok is not None else ""
        p, g = req.params, req.guide
        if g is not None and not g.accept(tok):
            req.finish_reason, req.error = "error", f"token {tok} is outside the request's grammar"
        elif g is not None and g.terminated:        # complete, and its end token taken (ignore_eos or not)
            req.finish_reason = "stop"
        elif not p.ignore_eos and tok in self.host.eos_token_ids or tok in p.stop_token_ids:
            req.finish_reason = "stop"
        elif req.detok is not None and req.detok.stopped:
            req.finish_reason = "stop"
        elif pos + 1 >= req.max_tokens:             # its rows reach max_rows (prompt + max_tokens) there too
            req.finish_reason = "length"
        if req.finish_reason:
            ev = self._finish(req)
            ev.token_ids, ev.text = [tok], text + ev.text
            return ev
        return Event(req, [tok], text, False)

    def _keep_hidden(self, plan, result) -> None:
        """The LLM rows a speaking request's follow prompt reads (the rows the host names, of the ports the
        follow stage reads)."""
        speaking = {c.req.id: c.req for c in plan.chunks if c.req.speech is not None}
        port = self.plan.pipeline.follow.reads
        if not speaking:
            return
        if port in result.outputs:
            want = {rid: r.speech.hidden_rows for rid, r in speaking.items()}
            hidden = result.outputs[port]
            for i, (rid, row) in enumerate(result.rows):
                if rid in want and row in want[rid]:
                    speaking[rid].speech.hidden[row] = hidden[i].clone()
        self.speech.handed(list(speaking.values()))     # a stream lane waits for this step before reading them

    def _close(self, req: Request) -> None:
        del req.output[len(req.known):]          # a token of a step in flight that it will never read
        self.scheduler.release(req)
        if req.speech is not None:
            self.speech.release(req.speech)
            if req in self.talking:
                self.talking.remove(req)
        self.requests.pop(req.id, None)
        req.closed = True
        req.times["finished"] = time.perf_counter()

    def _finish(self, req: Request) -> Event:
        """The LLM is done with it (or it failed). A speaking request stays open for its speech."""
        tail = req.detok.finish() if req.detok is not None and req.finish_reason != "error" else ""
        s = req.speech
        if s is not None and req.finish_reason != "error":
            del req.output[len(req.known):]      # a row of the step in flight is void (flight.py)
            self.scheduler.release(req)
            req.times["text_finished"] = time.perf_counter()
            s.text_done = True
            ev = self._maybe_close(req) or Event(req, [], "", False)
            ev.text = tail + ev.text
            return ev
        self._close(req)
        return Event(req, [], tail, True)

    def output(self, req: Request) -> Output:
        t = req.times
        times = {"ttft_s": t["first_token"] - t["arrived"]} if "first_token" in t else {}
        if "finished" in t:
            times["total_s"] = t["finished"] - t["arrived"]
        out = Output(id=req.id, kind=req.kind, prompt_tokens=len(req.prompt.ids), token_ids=list(req.output),
                     text=req.detok.text if req.detok is not None else None, finish_reason=req.finish_reason,
                     logprobs=req.logprobs, prompt_logprobs=req.prompt_logprobs, error=req.error, times=times)
        s = req.speech
        if s is not None:
            import numpy as np

            out.audio = np.concatenate(s.audio) if s.audio else np.zeros(0, dtype=np.float32)
            out.sample_rate, out.audio_codes, out.audio_finish_reason = self.speech.sample_rate, s.frames, s.ended
            if "first_audio" in t:
                times["first_audio_s"] = t["first_audio"] - t["arrived"]
                times["audio_stall_s"] = stall_s(s.sent, [len(a) for a in s.audio], self.speech.sample_rate)
        return out

    # ---- what ran
    def stats(self, wall_s: float | None = None) -> dict:
        st = self.scheduler.stats
        out = {"steps": dict(st.steps), "preemptions": st.preemptions,
               "rungs": {f"{w}/{n}/{r}": c for (w, n, r), c in sorted(st.rungs.items(), key=str)},
               "padding": {f"{w}/{n}": {"used": st.used[(w, n)], "padded": st.padding[(w, n)]}
                           for (w, n) in sorted(st.used)},
               "replayed": sum(c for (_, _, r), c in st.rungs.items() if r != "eager"),
               "eager": sum(c for (_, _, r), c in st.rungs.items() if r == "eager"),
               "step_ms": {w: 1e3 * st.seconds[w] / st.steps[w] for w in st.steps if st.seconds[w]}}
        sh = self.scheduler.shared
        if sh is not None:
            out["prefix_cache"] = {"query_rows": sh.query_rows, "hit_rows": sh.hit_rows, "cached_pages": len(sh.key_of),
                                   "idle_pages": len(sh.idle), "evicted_pages": sh.evicted}
            if self.scheduler.follow is not None:
                out["prefix_cache"]["follow_rows"] = self.scheduler.follow.stats()
        if self.executor.media:
            out["media_cache"] = {node: c.stats() for node, c in self.executor.media.items()}
        out["devices"] = {str(d): dict(c) for d, c in self.devices.items()}
        if self.workers is not None:
            out["remote"] = self.workers.step_stats()
        if wall_s is not None:
            out["wall_s"] = wall_s
        return out

    @staticmethod
    def stats_line(stats: dict) -> str:
        steps = ", ".join(f"{w} {n}" for w, n in stats["steps"].items())
        line = (f"steps: {steps}; node steps replayed {stats['replayed']}, eager {stats['eager']}; "
                f"preemptions {stats['preemptions']}")
        if stats.get("generated_tokens"):
            line += (f"; {stats['generated_tokens']} tokens in {stats['wall_s']:.2f} s = {stats['tokens_per_s']:.1f} "
                     f"tokens/s; TTFT p50 {stats['ttft_s']['p50'] * 1e3:.0f} ms, p90 {stats['ttft_s']['p90'] * 1e3:.0f} ms")
        r = stats.get("remote")
        if r and r["steps"]:
            line += (f"; other devices: {r['steps']} node steps, {r['seconds'] / r['steps'] * 1e3:.2f} ms each (p50 "
                     f"{r['step_ms']['p50']:.2f}), of which {r['request_seconds'] / r['steps'] * 1e3:.2f} ms sending the "
                     f"step ({r.get('send_bytes', 0) / r['steps'] / 1e6:.2f} MB device to device), "
                     f"{r['recv_seconds'] / r['steps'] * 1e3:.3f} ms (p50 {r['recv_ms']['p50']:.3f}) receiving "
                     f"{r['recv_bytes'] / r['steps'] / 1e6:.2f} MB")
        return line

    # ---- offline
    def generate(self, items: list[dict], progress: bool = False) -> list[Output]:
        """Run a batch of request dicts (parse_request's shape), arriving at once; outputs in input order. A
        request the engine refuses comes back with finish_reason 'refused' and the reason in `error`."""
        limits = self.media_limits()
        return self.run_parsed([parse_or_refuse(item, i, limits) for i, item in enumerate(items)], progress)

    def run_parsed(self, parsed: list, progress: bool = False, stop: Callable[[], bool] = lambda: False
                   ) -> list[Output]:
        """generate() after parse_or_refuse (which loads the media: graphc run --ray does that where the
        requests are read, not where the engine runs). stop: asked before each step; true raises
        KeyboardInterrupt there (a Ctrl-C that Python dropped: batch.sigint_latch)."""
        from tqdm import tqdm

        reqs: list[Request | Output] = []
        for i, item in enumerate(parsed):
            if isinstance(item, Output):
                reqs.append(item)
                continue
            try:
                reqs.append(self.add(**item))
            except InvalidInput as e:             # refused with its reason; the others still run
                reqs.append(refused(item.get("request_id") or f"line-{i}", e))
        live = sum(isinstance(r, Request) for r in reqs)
        with tqdm(total=live, desc="requests", unit="req", file=sys.stderr, disable=not progress) as bar:
            while self.has_work():
                if stop():
                    raise KeyboardInterrupt
                for ev in self.step():
                    if ev.finished:
                        bar.update(1)
        return [self.output(r) if isinstance(r, Request) else r for r in reqs]

    # ---- what the server reads
    @property
    def model_name(self) -> str:
        """The served model's name, as the plan records it."""
        return self.plan.model.name

    @property
    def max_running(self) -> int:
        """The most sequences the decode walk runs at once."""
        return self.scheduler.max_running

    @property
    def max_seq_len(self) -> int:
        """The most rows (prompt and output) one request may hold in the LLM's KV cache."""
        return self.executor.kv_spec.max_seq_len

    @property
    def has_workers(self) -> bool:
        """Whether worker or rank processes run other plan devices (an idle step() checks that they live)."""
        return self.workers is not None or self.ranks is not None

    @property
    def speaks(self) -> bool:
        """Whether requests may ask for speech out (the model's host speaks and the plan has a speaking kind)."""
        return self.speech is not None

    @property
    def sample_rate(self) -> int | None:
        """The sample rate of the audio it speaks; None when it does not speak."""
        return self.speech.sample_rate if self.speech is not None else None

    @property
    def transcription(self):
        """The model host's graphc.Transcription (its own transcription prompt and answer reader), or None."""
        return getattr(self.host, "transcription", None)

    def request(self, request_id: str) -> Request | None:
        """The request of that id still in flight (added, not closed), else None."""
        return self.requests.get(request_id)

    def load(self) -> dict[str, int]:
        """What it holds now: running and waiting requests, free and total KV pages of the LLM's pool; when
        it speaks also the requests still speaking and the speech lane's free and total pages."""
        s = self.scheduler
        out = {"running": len(s.running), "waiting": len(s.waiting), "free_pages": s.pages.num_free,
               "pages": s.capacity}
        if self.speech is not None:
            out |= {"speaking": len(self.talking), "speech_free_pages": self.speech.pages.num_free,
                    "speech_pages": self.speech.capacity}
        return out


REQUEST_KEYS = {"id", "messages", "prompt", "prompt_token_ids", "media", "use_audio_in_video", "modalities", "audio"}


def refused(rid: str, e: InvalidInput) -> Output:
    return Output(id=rid, kind="", prompt_tokens=0, token_ids=[], text=None, finish_reason="refused", error=str(e))


def parse_or_refuse(item, index: int, limits=None) -> dict | Output:
    """parse_request's keyword arguments for Engine.add, or the request refused with its reason."""
    try:
        return parse_request(item, index, limits)
    except InvalidInput as e:
        return refused(item.get("id", f"line-{index}") if isinstance(item, dict) else f"line-{index}", e)


def check_options(checkpoint, random_weights: bool, default_max_tokens: int | None, chat_template: str | None,
                  tokenizer: str | Path | None = None, audio_lead_ms: float | None = None):
    """The Engine's options that can be refused before a byte is loaded: (the text folder its tokenizer and
    chat template come from, or None; the given chat template, parsed, or None)."""
    from graphc.runtime.chat import ChatTemplate, text_folder

    if checkpoint is None and not random_weights:
        raise InvalidInput("no weights to serve", "graphc run needs a checkpoint",
                           "pass --checkpoint DIR, or --random-weights to serve seeded weights (with --tokenizer DIR "
                           "for text, else token ids only)")
    if default_max_tokens is not None and default_max_tokens < 1:
        raise InvalidInput(f"default max_tokens {default_max_tokens}", "a request must be able to make a token",
                           "pass 1 or more (--default-max-tokens)")
    if audio_lead_ms is not None and not 0 <= audio_lead_ms < float("inf"):
        raise InvalidInput(f"audio lead {audio_lead_ms} ms", "a chunk may wait only while its request's audio leads "
                           "playback by more than a finite lead", "pass 0 or more (--audio-lead-ms)")
    folder = text_folder(checkpoint, tokenizer)
    if chat_template is None:
        return folder, None
    if folder is None:
        raise InvalidInput("--chat-template with no tokenizer", "a template renders text, which a tokenizer.json "
                           "tokenizes", "pass --tokenizer DIR, or serve a checkpoint with tokenizer.json")
    return folder, ChatTemplate.given(chat_template, folder)   # refused: a missing file, a template that does not parse


def vocab_rows(plan: Plan) -> int:
    """The LLM's vocabulary rows (its logits' width), from the plan's declaration (no weights)."""
    from graphc.source import load_model

    model = load_model(plan.model.file, plan.model.preset, plan.model.config).model
    return model.node(llm_node(plan)).outputs["logits"].shape[-1]


def check_checkpoint(plan: Plan, checkpoint: str | Path | None) -> None:
    """A plan declared from a checkpoint's config serves that checkpoint only: a differing config.json is
    refused by its first differing field, and seeded weights by name."""
    if plan.model.config is None:
        return
    if checkpoint is None:
        raise InvalidInput("this plan was declared from a checkpoint's config.json", "seeded weights have no config",
                           "pass the checkpoint (--checkpoint DIR)")
    diff = first_difference(plan.model.config, read_config(checkpoint))
    if diff:
        raise InvalidInput(f"{checkpoint}/config.json differs from the config the plan was made from",
                           f"first difference: {diff}", f"plan again with --checkpoint {checkpoint}")


def parse_request(item: dict, index: int = 0, limits=None) -> dict:
    """One offline request (a JSONL line): messages | prompt | prompt_token_ids, optional media
    [{type: audio|image|video, path, fps}], id and use_audio_in_video, modalities ["text", "audio"] with
    audio {voice, max_frames, first_chunk} for speech out, and sampling parameters by name. Media are loaded
    within `limits` (inputs.Limits: Engine.media_limits(), which also says how a video is sampled)."""
    from graphc.runtime.inputs import Limits, load_media

    if not isinstance(item, dict):
        raise InvalidInput(f"request {index} is {type(item).__name__}, not an object", "", "write one JSON object a line")
    params = {k: v for k, v in item.items() if k not in REQUEST_KEYS}
    try:
        sp = SamplingParams(**params)
    except Exception as e:
        raise InvalidInput(f"request {index}: bad sampling parameters", str(e),
                           f"request keys: {sorted(REQUEST_KEYS)}; sampling: {sorted(SamplingParams.model_fields)}") from None
    media = []
    for j, m in enumerate(item.get("media", [])):
        kind, path = m.get("type"), m.get("path")
        if kind not in ("audio", "image", "video"):
            raise InvalidInput(f"request {index}: media type {kind!r}", "", "use audio, image or video")
        media.append(load_media(kind, path, f"request {index}: media[{j}]", m.get("fps"),
                                bool(item.get("use_audio_in_video")) and kind == "video", limits or Limits()))
    speech = None
    modalities = item.get("modalities") or ["text"]
    if modalities not in (["text"], ["text", "audio"]) or ("audio" in item) != ("audio" in modalities):
        raise InvalidInput(f"request {index}: modalities {modalities} with audio {item.get('audio')}",
                           "speech out takes modalities [\"text\", \"audio\"] and an audio object",
                           "send both, or neither for text only")
    if "audio" in modalities:
        try:
            speech = SpeechParams(**item["audio"])
        except Exception as e:
            raise InvalidInput(f"request {index}: bad audio", str(e),
                               f"audio keys: {sorted(SpeechParams.model_fields)}") from None
    return dict(prompt_token_ids=item.get("prompt_token_ids"), messages=item.get("messages"),
                prompt=item.get("prompt"), media=media, params=sp, request_id=item.get("id"),
                use_audio_in_video=bool(item.get("use_audio_in_video", False)), speech=speech)


def read_jsonl(path: str | Path) -> list[dict]:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise InvalidInput(f"cannot read --requests {path}", str(e), "pass a JSONL file of requests") from None
    except UnicodeDecodeError as e:
        raise InvalidInput(f"--requests {path} is not a text file", f"byte {e.start} is not UTF-8",
                           "pass a JSONL file of requests, one JSON object a line") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError) as e:   # not JSON, a 4301-digit int, or nested too deep
                why = str(e).split(";")[0] if isinstance(e, ValueError) else "it nests deeper than a parser follows"
                raise InvalidInput(f"{path}:{n} is not JSON", why, "write one JSON object a line") from None
    return out
