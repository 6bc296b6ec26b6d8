"""Continuous batching over a plan's walks: each step runs one walk on a batch that fits its budget.

Policy (nano-vllm's, with walks):
  - Admission in order of arrival, while the decode walk has a sequence slot and the pool has the pages
    of the request's rows (prompt, or prompt and tokens so far after a preemption). A request that can
    never fit (longer than the plan's longest, or a media piece larger than its walk's budget) is
    refused when it is added, with the numbers.
  - Prefill before decode, alternating so neither starves: after a prefill step that carried no decode
    rows, a decode step runs if any request is decoding. The oldest prefilling request picks the walk
    (its current stage's); others on the same stage join in order of arrival. Chunks never cut a media
    piece; a stage runs to its end (the last media row, or the prompt's end).
  - A text prefill joins the decoding requests' rows through the mixed walk when the plan has one.
  - Decode grows each request by a page when its next row needs one; when the pool is empty the
    youngest running request is preempted (pages freed, recomputed later).
  - A request that asks for prompt logprobs takes no cached pages, and each row of its chunk counts as a
    sequence of the step: every row's logits are read, and a step's logits stay within the rows planned
    for its sequences. Such a step runs eagerly (a captured rung reads one row a sequence).
  - Each node on the walk is padded to the smallest captured rung that holds it (the plan's graphs);
    past the captured rungs the step runs eagerly, as the plan says. Steps, rungs and padding are counted.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from graphc.declare import Model
from graphc.errors import InvalidInput
from graphc.plan import Plan
from graphc.serving import Piece
from graphc.runtime.follow_rows import FollowRows
from graphc.runtime.prefix_cache import SharedPages, chain_keys, piece_key
from graphc.runtime.request import Request, Status
from resources.linear_state import SlotAllocator
from resources.paged_kv import PageAllocator, PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec


@dataclass
class Chunk:
    req: Request
    start: int
    end: int
    pieces: list[Piece]
    sample: bool                 # its last row's logits give the request's next token
    score: tuple[int, int] | None = None     # rows [a, b) whose logits score prompt tokens a + 1 .. b


@dataclass
class StepPlan:
    walk: str
    chunks: list[Chunk]                                  # prefill chunks, then decode rows (one row each)
    sizes: dict[str, int]                                # node -> units on its capture axis (0: not run)
    rungs: dict[str, int | None]                         # node -> captured rung replayed, None: eager
    preempted: list[Request] = field(default_factory=list)


@dataclass
class Stats:
    steps: Counter = field(default_factory=Counter)          # walk -> steps
    rungs: Counter = field(default_factory=Counter)          # (walk, node, rung or 'eager') -> steps
    padding: Counter = field(default_factory=Counter)        # (walk, node) -> padded units
    used: Counter = field(default_factory=Counter)           # (walk, node) -> real units
    preemptions: int = 0
    seconds: Counter = field(default_factory=Counter)        # walk -> wall seconds of its steps (host and device)


def _limits(model: Model, walk: str, units_axes: dict[str, str]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(tokens, seqs, {encoder: (units, segments)}) one step of the walk may carry; segments None: any number."""
    w = model.walk(walk)
    b = w.budget.axes()
    tokens, seqs = b.get("tokens", b.get("seqs", 1)), b.get("seqs", 1)
    per = {}
    for node, axis in units_axes.items():
        segments = None
        for res in model.node(node).resources.values():
            spec = model.resource(res)
            if isinstance(spec, RaggedAttentionSpec):
                segments = spec.step_shape(axis, dict(b), "prefill").seqs - spec.padding_segments
        per[node] = (b.get(axis, 0), segments)
    return tokens, seqs, per


class Scheduler:
    def __init__(self, plan: Plan, model: Model, llm: str, kv: PagedKVSpec, pages: PageAllocator, reserved: int = 0,
                 slots: dict[str, SlotAllocator] | None = None, prefix_cache: bool = True):
        """slots: the LLM's linear_state resources' slots; a running request holds one of each. prefix_cache:
        share full text pages across requests (graphc/runtime/prefix_cache.py; never with state slots)."""
        self.plan, self.model, self.llm, self.kv, self.pages = plan, model, llm, kv, pages
        self.slots = slots or {}
        self.shared = SharedPages(pages, kv.page_size) if prefix_cache and not self.slots else None
        self.follow: FollowRows | None = None      # the follow stage's LLM rows of cached pages (the engine's)
        if self.shared is not None:
            self.pages = self.shared
        self.capacity = pages.num_pages - reserved        # pages requests may hold (the rest: the scratch page)
        llm_walks = [w for w in model.walks if w.path == (llm,)]
        self.decode_walk = next(w.name for w in llm_walks if w.kind == "decode")
        self.mixed_walk = next((w.name for w in llm_walks if w.kind == "mixed"), None)
        self.max_running = model.walk(self.decode_walk).budget.seqs
        self.encoder: dict[str, str | None] = {}                # walk -> its first encoder (None: a text walk)
        self.units_axes: dict[str, dict[str, str]] = {}         # walk -> {encoder: its capture axis}
        for w in model.walks:
            enc = [n for n in w.path if n != llm]
            self.encoder[w.name] = enc[0] if enc else None
            self.units_axes[w.name] = {n: plan.nodes[n].buckets[w.name].axis for n in enc}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = Stats()
        self._last_prefill_alone = False

    # ---- requests in and out
    def check(self, req: Request) -> None:
        """Refuse, with the numbers, a request the plan can never serve."""
        most = self.kv.max_seq_len
        if req.max_rows > most:
            raise InvalidInput(f"request {req.id} asks for {req.max_rows} tokens ({len(req.prompt.ids)} prompt + "
                               f"{req.max_rows - len(req.prompt.ids)} to generate); the plan allows {most}",
                               f"{self.kv.name}.max_seq_len is {most}; the pool holds {self.capacity} pages "
                               f"of {self.kv.page_size} tokens, {self.pages.num_free} free now",
                               "shorten the prompt or max_tokens, or plan with a larger "
                               f"resources.{self.kv.name}.max_seq_len")
        if self.kv.pages_for(req.max_rows) > self.capacity:
            raise InvalidInput(f"request {req.id} needs {self.kv.pages_for(req.max_rows)} pages; the pool has "
                               f"{self.capacity}", "", "shorten it or plan more pages")
        for walk in req.prefill_walks:
            tokens, _, per = _limits(self.model, walk, self.units_axes[walk])
            for group in _indivisible(req.pending_pieces(walk)):
                span = max(p.last for p in group) - min(p.first for p in group) + 1
                over = span > tokens
                need = []
                for node, (units, segments) in per.items():
                    mine = [p for p in group if _node(p, walk, per) == node]
                    u, sg = sum(p.units for p in mine), sum(p.segments for p in mine)
                    over |= u > units or (segments is not None and sg > segments)
                    need.append(f"{u} {self.units_axes[walk][node]} and {sg} attention segments on {node} "
                                f"(at most {units} and {'any number' if segments is None else segments})")
                if over:
                    raise InvalidInput(
                        f"request {req.id}: a media item takes {span} prompt rows, " + ", ".join(need)
                        + f" in one step of {walk}",
                        f"one step of {walk} carries at most {tokens} tokens", "send a smaller image or video, "
                        f"or plan with a larger walks.{walk}.budget")

    def add(self, req: Request) -> None:
        self.check(req)
        self.waiting.append(req)

    def release(self, req: Request) -> None:
        """Give back a request's pages and forget it (finished, aborted or failed)."""
        if req.pages:
            self._register(req)
            self.pages.free(req.pages)
            req.pages = []
        self._free_slots(req)
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        req.status = Status.FINISHED

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def pool_full(self) -> bool:
        """Every page requests may hold is free (what an idle engine must show)."""
        return self.pages.num_free == self.capacity and all(a.all_free() for a in self.slots.values())

    def _free_slots(self, req: Request) -> None:
        for res, slot in req.slots.items():
            self.slots[res].free(slot)
        req.slots = {}

    # ---- one step
    # ---- prefix caching
    def _whole_pieces(self, req: Request, rows: int) -> int:
        """The last page boundary at or below `rows` that no media piece straddles."""
        ps, pieces = self.kv.page_size, [p for m in req.prompt.media for p in m.pieces]
        end, moved = rows - rows % ps, True
        while moved:
            moved = False
            for p in pieces:
                if p.first < end <= p.last:
                    end, moved = p.first - p.first % ps, True
        return end

    def _keys(self, req: Request, rows: int) -> list[bytes]:
        """The chain keys of the request's full pages within `rows`, pieces whole (prefix_cache.chain_keys)."""
        ps = self.kv.page_size
        rows = self._whole_pieces(req, rows)
        on_page: dict[int, list[Piece]] = {}               # page -> the pieces with rows in it, in row order
        for p in sorted((p for m in req.prompt.media for p in m.pieces), key=lambda p: p.first):
            first = p.first
            if first < rows:
                for page in range(first // ps, p.last // ps + 1):
                    on_page.setdefault(page, []).append(p)

        def media(i: int) -> bytes | None:
            out = b""
            for p in on_page.get(i, ()):
                key = piece_key(req, p)
                if key is None:
                    return None
                out += key + p.first.to_bytes(8, "little")
            return out
        return chain_keys(req.row_ids(0, rows), ps, rows, media)

    def cached_rows(self, ids: list[int], rows: int) -> int:
        """How many of the first `rows` rows of these text ids the cache holds now (a replica's routing hint)."""
        if self.shared is None:
            return 0
        return self.shared.matched(chain_keys(ids, self.kv.page_size, rows)) * self.kv.page_size

    def _lookup(self, req: Request) -> list[int]:
        """The cached pages that hold the request's first rows (held now), keeping its last row to compute; for a
        speaking request, only pages whose rows its follow stage reads (speech.hidden_rows) the follow cache
        holds, and those rows copied to it (graphc/runtime/follow_rows.py)."""
        if self.shared is None or req.scoring:
            return []
        keys = self._keys(req, req.target - 1)
        if req.speech is None:
            return self.shared.share(keys)
        named, n = self._named(req), 0
        while n < len(keys) and (n not in named or self._follow_holds(keys[n], named[n])):
            n += 1
        pages = self.shared.share(keys[:n])
        for i in range(len(pages)):
            if i in named:
                ps = self.kv.page_size
                req.speech.hidden |= {i * ps + o: row for o, row in self.follow.take(keys[i], named[i]).items()}
        return pages

    def _follow_holds(self, key: bytes, offsets: list[int]) -> bool:
        return self.follow is not None and self.follow.holds(key, offsets)

    def _named(self, req: Request) -> dict[int, list[int]]:
        """A speaking request's rows its follow stage reads, by page: page -> offsets within it, ascending."""
        out: dict[int, list[int]] = {}
        for row in sorted(req.speech.hidden_rows):
            out.setdefault(row // self.kv.page_size, []).append(row % self.kv.page_size)
        return out

    def _register(self, req: Request) -> None:
        """Cache a request's full pages of computed rows, unless its step failed; a speaking request's rows its
        follow stage reads go to the follow cache with their pages."""
        if self.shared is None or req.error is not None:
            return
        keys = self._keys(req, req.computed)
        self.shared.register(req.pages[:len(keys)], keys)
        if req.speech is None or self.follow is None:
            return
        ps, hidden = self.kv.page_size, req.speech.hidden
        for i, offsets in self._named(req).items():
            if i < len(keys) and all(i * ps + o in hidden for o in offsets):
                self.follow.store(keys[i], {o: hidden[i * ps + o] for o in offsets})

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            hit = self._lookup(req)
            need = self.kv.pages_for(req.target) - len(hit)
            if not self.pages.can_allocate(need) or not all(a.can_allocate() for a in self.slots.values()):
                self.pages.free(hit)
                break
            self.waiting.popleft()
            req.pages = hit + self.pages.allocate(need)
            req.computed = len(hit) * self.kv.page_size
            if self.shared is not None and not req.scoring:
                self.shared.query_rows += req.target
            if hit:
                self.shared.hit_rows += req.computed
                if req.speech is not None and self.follow is not None:
                    self.follow.hit_rows += sum(r < req.computed for r in req.speech.hidden_rows)
                if not req.preemptions:
                    req.cached = req.computed
            req.slots = {res: a.allocate() for res, a in self.slots.items()}
            req.status = Status.RUNNING
            self.running.append(req)
            self.running.sort(key=lambda r: r.arrival)

    def _preempt(self, victim: Request, step: list[Request]) -> None:
        self._register(victim)                # its computed pages may serve it (or another) again
        self.pages.free(victim.pages)
        self._free_slots(victim)             # recomputed from its first row: its state starts again from zeros
        victim.pages, victim.computed, victim.status = [], 0, Status.WAITING
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.running.remove(victim)
        self.waiting.appendleft(victim)
        step.append(victim)

    def _grow_decoders(self, decoders: list[Request], preempted: list[Request]) -> list[Request]:
        """Pages for each decoding request's next row, preempting the youngest when the pool is empty."""
        out = []
        for req in decoders:
            if req.status is not Status.RUNNING:
                continue
            need = self.kv.pages_for(req.computed + 1) - len(req.pages)
            while need > self.pages.num_free:
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim, preempted)
                if victim is req:
                    break
            if req.status is Status.RUNNING:
                req.pages += self.pages.allocate(need)
                out.append(req)
        return out

    def schedule(self) -> StepPlan | None:
        self._admit()
        prefilling = [r for r in self.running if r.prefilling]
        decoding = [r for r in self.running if r.decoding and not r.exhausted][:self.max_running]
        if prefilling and not (decoding and self._last_prefill_alone):
            walk = prefilling[0].stage()
            mixed = decoding and self.mixed_walk is not None and self.encoder[walk] is None
            preempted: list[Request] = []
            rows = self._grow_decoders(decoding, preempted) if mixed else []
            plan = self._prefill(self.mixed_walk if mixed else walk, walk, prefilling, rows)
            plan.preempted = preempted
            self._last_prefill_alone = not rows
            if plan.chunks:
                return self._count(plan)
        self._last_prefill_alone = False
        if decoding:
            preempted = []
            rows = self._grow_decoders(decoding, preempted)
            plan = StepPlan(self.decode_walk, [Chunk(r, r.computed, r.computed + 1, [], True) for r in rows],
                            {}, {}, preempted)
            plan.sizes[self.llm] = len(rows)
            if plan.chunks:
                return self._count(plan)
            return self.schedule() if self.running or self.waiting else None
        return None

    def _prefill(self, run_walk: str, stage_walk: str, prefilling: list[Request], decode: list[Request]) -> StepPlan:
        tokens, seqs, per = _limits(self.model, run_walk, self.units_axes[run_walk])
        tokens -= len(decode)
        seqs -= len(decode)
        chunks: list[Chunk] = []
        left = dict(per)                          # encoder -> (units, segments) still free in this step
        for req in prefilling:
            if tokens <= 0 or seqs <= 0:
                break
            if req.status is not Status.RUNNING or req.stage() != stage_walk:
                continue                  # preempted just now to grow a decoding request, or on another stage
            end, pieces = cut(req, stage_walk, min(tokens, seqs) if req.scoring else tokens, left)
            if end <= req.computed:
                continue
            chunks.append(Chunk(req, req.computed, end, pieces, sample=end == req.target and not req.output,
                                score=req.scored_rows(req.computed, end)))
            tokens -= end - req.computed
            seqs -= end - req.computed if req.scoring else 1
            for p in pieces:
                node = _node(p, stage_walk, per)
                u, sg = left[node]
                left[node] = (u - p.units, None if sg is None else sg - p.segments)
        chunks += [Chunk(r, r.computed, r.computed + 1, [], True) for r in decode]
        sizes = {self.llm: sum(c.end - c.start for c in chunks)}
        for node in per:
            sizes[node] = sum(p.units for c in chunks for p in c.pieces if _node(p, run_walk, per) == node)
        return StepPlan(run_walk, chunks, sizes, {})

    def _count(self, plan: StepPlan) -> StepPlan:
        self.stats.steps[plan.walk] += 1
        for node, size in plan.sizes.items():
            if size == 0:
                continue
            b = self.plan.nodes[node].buckets[plan.walk]
            fits = [r for r in b.captured if r >= size]
            rung = min(fits) if fits and not (node == self.llm and any(c.score for c in plan.chunks)) else None
            plan.rungs[node] = rung
            self.stats.rungs[(plan.walk, node, rung if rung is not None else "eager")] += 1
            self.stats.used[(plan.walk, node)] += size
            self.stats.padding[(plan.walk, node)] += (rung - size) if rung is not None else 0
        return plan


def _indivisible(pieces: list[Piece]) -> list[list[Piece]]:
    """Pieces whose row spans overlap run in one step: groups of them, in row order."""
    groups: list[list[Piece]] = []
    for p in sorted(pieces, key=lambda p: p.first):
        if groups and p.first <= max(q.last for q in groups[-1]):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def _node(piece: Piece, walk: str, per: dict) -> str:
    """The encoder that runs a piece: the one the host named, else the walk's only encoder."""
    return piece.node or next(iter(per))


def cut(req: Request, walk: str, tokens: int, left: dict[str, tuple[int, int]]) -> tuple[int, list[Piece]]:
    """The furthest row a chunk from req.computed may end at, within `tokens` rows and each encoder's
    units and attention segments still free (`left`: encoder -> (units, segments), None segments: any),
    never cutting a group of media pieces; and the pieces it encodes."""
    start = req.computed
    end = min(req.stage_end(walk), start + tokens)
    taken: list[Piece] = []
    left = dict(left)
    for group in _indivisible(req.pending_pieces(walk)):
        lo, hi = min(p.first for p in group), max(p.last for p in group)
        if lo >= end:
            break
        need: dict[str, list[int]] = {}
        for p in group:
            n = need.setdefault(_node(p, walk, left), [0, 0])
            n[0] += p.units
            n[1] += p.segments
        fits = all(u <= left[node][0] and (left[node][1] is None or sg <= left[node][1])
                   for node, (u, sg) in need.items())
        if hi >= end or not fits:
            end = lo
            break
        taken += group
        for node, (u, sg) in need.items():
            left[node] = (left[node][0] - u, None if left[node][1] is None else left[node][1] - sg)
    return end, taken
