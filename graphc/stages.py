"""The serving pipeline a model declares: its stages, what passes between them, and what serving needs
of a plan's walks.

A pipeline is data, like the rest of a declaration. Its stages, in the order a request flows:

  LLMStage        the autoregressive LLM: its decode walk and the prefill walks that end on it; it emits
                  text, a token a step
  EncoderStage    an encoder per media kind: the prefill walks that run it and splice its rows into the
                  LLM's chunk
  FollowStage     a second autoregressive stage fed by the LLM's rows (hidden states read at rows the host
                  names, and the LLM's tokens): one frame of codes a decode step
  ChunkStage      a decoder that turns chunks of the follow stage's codes into audio, a chunk a step, in
                  slots of `slot_frames` frames; it emits audio

The host hooks a pipeline's stages call (building the prompt, cutting media into pieces, the follow
stage's rows, the chunk stage's slots) are graphc.serving's contract; the model file's `host()` returns
an object that fulfils it.

What serving needs of a plan is checked twice from the same rules (`problems`): when a model is declared
or re-declared with overrides (so `graphc plan --set` and every remedy that breaks a rule is refused), and
by `graphc run` on the plan's walks before it loads anything.
"""
from __future__ import annotations

from typing import Annotated, Iterable, Literal, Union

from pydantic import Field, model_validator

from graphc.strict import Strict

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
MediaKind = Literal["audio", "image", "video"]


class LLMStage(Strict):
    """The autoregressive LLM: `decode` is its decode walk, `prefill` its text prefill walks (a mixed walk,
    a prefill chunk beside decode rows, among them); each over the node alone. Walks with encoders on
    their path are the encoder stages'."""

    kind: Literal["llm"] = "llm"
    name: str = Field(pattern=_NAME)
    node: str = Field(pattern=_NAME)
    decode: str = Field(pattern=_NAME)
    prefill: tuple[str, ...] = Field(min_length=1)


class EncoderStage(Strict):
    """An encoder of some media kinds: `walks` run it into the LLM stage's chunk (the walk's path holds the
    encoder, then ends at the LLM's node)."""

    kind: Literal["encoder"] = "encoder"
    name: str = Field(pattern=_NAME)
    node: str = Field(pattern=_NAME)
    media: tuple[MediaKind, ...] = Field(min_length=1)
    walks: tuple[str, ...] = Field(min_length=1)


class FollowStage(Strict):
    """A second autoregressive stage after stage `after`: its `prefill` walk runs the prompt rows the host
    builds from `after`'s rows (its output port `reads`, at the rows the host names, and its tokens), its
    `decode` walk one frame of codes per request a step (output port `codes`; its output `next_embeds` is a
    request's next input row)."""

    kind: Literal["follow"] = "follow"
    name: str = Field(pattern=_NAME)
    node: str = Field(pattern=_NAME)
    after: str = Field(pattern=_NAME)
    reads: str = Field(pattern=_NAME)
    prefill: str = Field(pattern=_NAME)
    decode: str = Field(pattern=_NAME)
    codes: str = "codes"


class ChunkStage(Strict):
    """A decoder of stage `after`'s codes into audio, a chunk at a time: each of `walks` (kind chunk, a
    frames and a seqs budget) carries slots of frames/seqs frames, and the longest slot must be exactly
    `slot_frames`, the chunk the host cuts (left context included). Its output `wav` is the slots' audio,
    slot after slot, at `sample_rate`."""

    kind: Literal["chunk"] = "chunk"
    name: str = Field(pattern=_NAME)
    node: str = Field(pattern=_NAME)
    after: str = Field(pattern=_NAME)
    walks: tuple[str, ...] = Field(min_length=1)
    slot_frames: int = Field(ge=1)
    sample_rate: int = Field(ge=1)


Stage = Annotated[Union[LLMStage, EncoderStage, FollowStage, ChunkStage], Field(discriminator="kind")]


class Pipeline(Strict):
    """A model's serving pipeline: one LLM stage, any encoder stages, and optionally a follow stage with
    a chunk stage after it (speech out)."""

    stages: tuple[Stage, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> "Pipeline":
        names = [s.name for s in self.stages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pipeline stage names {', '.join(twice)} appear twice")
        if len(self.of("llm")) != 1:
            raise ValueError(f"a pipeline has exactly one llm stage, this one {len(self.of('llm'))}")
        follow, chunk = self.of("follow"), self.of("chunk")
        if len(follow) > 1 or len(chunk) > 1 or len(follow) != len(chunk):
            raise ValueError(f"a pipeline has at most one follow stage and one chunk stage, both or neither "
                             f"(this one: {len(follow)} and {len(chunk)})")
        for s in follow + chunk:
            want = "llm" if s.kind == "follow" else "follow"
            if s.after not in names or self.stage(s.after).kind != want:
                raise ValueError(f"stage {s.name} comes after '{s.after}', which is not the pipeline's {want} stage "
                                 f"(stages: {', '.join(names)})")
        return self

    def of(self, kind: str) -> list:
        return [s for s in self.stages if s.kind == kind]

    def stage(self, name: str):
        return next(s for s in self.stages if s.name == name)

    @property
    def llm(self) -> LLMStage:
        return self.of("llm")[0]

    @property
    def follow(self) -> FollowStage | None:
        return next(iter(self.of("follow")), None)

    @property
    def chunk(self) -> ChunkStage | None:
        return next(iter(self.of("chunk")), None)

    def speech_walks(self) -> list[str]:
        """The walks a speaking request runs beside the LLM's decode walk."""
        if self.follow is None:
            return []
        return [self.follow.prefill, self.follow.decode, *self.chunk.walks]


def walk_table(walks: Iterable) -> dict[str, tuple[str, tuple[str, ...], dict[str, int]]]:
    """name -> (kind, path, budget axes) of a declaration's walks (graphc.Walk) or a plan's
    ({name: PlanWalk} items)."""
    out = {}
    for w in walks:
        if isinstance(w, tuple):                       # (name, PlanWalk)
            name, w = w
            out[name] = (w.kind, tuple(w.path), dict(w.budget))
        else:
            out[w.name] = (w.kind, tuple(w.path), w.budget.axes())
    return out


def problems(pipeline: Pipeline, walks: dict, requests: dict[str, list[str]]) -> list[str]:
    """Every way these walks (walk_table) and request kinds (name -> its walks) break what the pipeline's
    stages need to be served; empty when they serve."""
    out = []
    for s in pipeline.stages:
        out += _stage_problems(s, pipeline, walks)
    if out:
        return out
    return _kind_problems(pipeline, walks, requests)


def _walk(walks: dict, stage, name: str, kinds: tuple[str, ...], path_ok, path_says: str) -> list[str]:
    if name not in walks:
        return [f"stage {stage.name} names walk '{name}', which the model does not declare "
                f"(walks: {', '.join(walks)})"]
    got_kind, path, _ = walks[name]
    if got_kind not in kinds or not path_ok(path):
        return [f"stage {stage.name}'s walk {name} is a {got_kind} walk over {' -> '.join(path)}; it must be a "
                f"{' or '.join(kinds)} walk {path_says}"]
    return []


def _stage_problems(s, pipeline: Pipeline, walks: dict) -> list[str]:
    llm = pipeline.llm.node
    if s.kind == "llm":
        out = _walk(walks, s, s.decode, ("decode",), lambda p: p == (s.node,), f"over {s.node} alone")
        for w in s.prefill:
            out += _walk(walks, s, w, ("prefill", "mixed"), lambda p: p == (s.node,), f"over {s.node} alone")
        return out
    if s.kind == "encoder":
        return [m for w in s.walks for m in _walk(walks, s, w, ("prefill",), lambda p: s.node in p and p[-1] == llm,
                                                   f"holding {s.node} and ending at {llm}")]
    if s.kind == "follow":
        alone = f"over {s.node} alone"
        return (_walk(walks, s, s.prefill, ("prefill",), lambda p: p == (s.node,), alone)
                + _walk(walks, s, s.decode, ("decode",), lambda p: p == (s.node,), alone))
    out = [m for w in s.walks for m in _walk(walks, s, w, ("chunk",), lambda p: p == (s.node,), f"over {s.node} alone")]
    return out or _slot_problems(s, walks)


def slot_frames(budget: dict[str, int]) -> int | None:
    """Frames a slot of a chunk walk holds (its frames budget over its seqs), None when it has no whole slots."""
    frames, seqs = budget.get("frames"), budget.get("seqs")
    if frames is None or seqs is None or frames % seqs:
        return None
    return frames // seqs


def _slot_problems(s: ChunkStage, walks: dict) -> list[str]:
    slots = {w: slot_frames(walks[w][2]) for w in s.walks}
    bad = [w for w, n in slots.items() if n is None]
    if bad:
        return [f"chunk walk {w} has budget {walks[w][2]}: stage {s.name} needs a frames budget that is a whole "
                f"number of slots (a multiple of seqs)" for w in bad]
    longest = max(slots.values())
    if longest != s.slot_frames:
        w = max(slots, key=slots.get)
        seqs = walks[w][2]["seqs"]
        return [f"the longest slot of stage {s.name}'s walks is {longest} frames ({w}: {walks[w][2]['frames']} frames "
                f"over {seqs} slots); its host cuts chunks of {s.slot_frames} frames, which must fit a slot exactly. "
                f"Fix: give {w} {s.slot_frames}-frame slots (budget frames = {s.slot_frames} x seqs, e.g. "
                f"walks.{w}.budget.frames={s.slot_frames * seqs}), or fewer slots to save memory "
                f"(walks.{w}.budget.seqs=N with frames={s.slot_frames}*N)"]
    return []


def _kind_problems(pipeline: Pipeline, walks: dict, requests: dict[str, list[str]]) -> list[str]:
    out = []
    speech = pipeline.speech_walks()
    for name, kind_walks in requests.items():
        missing = [w for w in kind_walks if w not in walks]
        if missing:
            out.append(f"request kind {name} runs walk(s) {', '.join(missing)}, which the model does not declare")
            continue
        if pipeline.llm.decode not in kind_walks:
            out.append(f"request kind {name} never runs the LLM's decode walk {pipeline.llm.decode}: every kind "
                       f"ends by decoding")
        used = [w for w in speech if w in kind_walks]
        if used and len(used) != len(speech):
            lack = [w for w in speech if w not in kind_walks]
            out.append(f"request kind {name} speaks but lacks walk(s) {', '.join(lack)}: a speaking kind runs "
                       f"every walk of stages {pipeline.follow.name} and {pipeline.chunk.name}")
    return out
