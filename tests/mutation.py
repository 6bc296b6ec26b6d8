"""Mutation testing: plant one small bug at a time in the code that decides the numbers, and count
how many the test suite catches. A tool, not a test (pytest does not collect it).

    pip install coverage                        # the only extra it needs
    python tests/mutation.py                    # every target file, 2 workers
    python tests/mutation.py graphc/allocator.py --workers 4 --json out.json
    python tests/mutation.py --update docs/data/mutation.json --json docs/data/mutation.json
                                                # after a change: only what it touched
    python tests/mutation.py FILE ... --update docs/data/mutation.json --json docs/data/mutation.json
                                                # the same for the changed lines of FILE ... alone

Mutants: each comparison flipped (< <=, > >=, == !=, in / not in, is / is not), each arithmetic or
bitwise operator swapped (+ -, * /, // /, % /, ** *, << >>, & |) and each augmented assignment,
and/or swapped, `not` and unary minus dropped, every integer and float constant n -> n + 1,
True <-> False, min <-> max, break <-> continue, and string constants that are compared, used as
keys or looked up (prefixed "XX"). Messages are not mutated: f-strings, and whatever a raise,
print or tqdm call is given; nor are annotations and decorators. Beside those, the named mutants of issue 9 (HAND below) are planted
as written.

Which tests run: every test of each test file that covers the mutated lines, found by one coverage
run with a context per test and the memo tables cleared before each (module-level lines, run at
import, take every file covering the file), those that killed the file's mutants so far first, then
the fastest, stopping at the first failure. tests/golden (snapshots that only say "regenerate") and tests/gpu
are left out: a mutant counts as killed only by a test that checks a number or a behaviour.
Hypothesis runs derandomized without its example database, so a result does not depend on luck or
on which mutant ran before. A mutant whose tests run past a time limit counts as killed (timeout).

Each worker forks every mutant's pytest from a process that has imported torch, transformers and
the rest, but none of the project, in its own copy of the tree, with bytecode caching off.
"""
from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from multiprocessing import Process, Queue
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["graphc/passes", "graphc/verify.py", "graphc/allocator.py", "graphc/simulate.py", "graphc/host_inputs.py",
           "resources/paged_kv.py", "models/components/moe.py"]
TEST_DIRS = ["tests/unit", "tests/property", "tests/parity"]
RECORD_TEST = "tests/unit/test_mutation_record.py"   # checks this tool's own output: not a test of the code
PRELOAD = ["torch", "transformers", "hypothesis", "pytest", "networkx", "pydantic", "yaml", "safetensors",
           "jinja2", "tqdm", "numpy", "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
           "transformers.models.qwen3_asr.modeling_qwen3_asr", "transformers.models.qwen3.modeling_qwen3"]

# issue 9's named mutants: (file, text, replacement, what)
HAND = [
    ("models/components/qwen3_dense.py", "norm_rope_qk(self.q_norm, self.k_norm,", "norm_rope_qk(self.q_norm, self.q_norm,",
     "k projected through q_norm"),
    # the input norm and the post-attention norm, each computed with the other's weights (a swap of the two)
    ("models/components/thinker.py", "self.input_layernorm(x)", "self.post_attention_layernorm(x)",
     "input norm with the post-attention norm's weights"),
    ("models/components/thinker.py", "self.post_attention_layernorm.add(", "self.input_layernorm.add(",
     "post-attention norm with the input norm's weights"),
    ("models/components/moe.py", "torch.softmax(logits, dim=-1, dtype=torch.float32)", "torch.softmax(logits, dim=-1)",
     "router softmax in the input dtype"),
    ("graphc/allocator.py", "(not small and rest > SMALL_SIZE)", "(not small and rest >= MIN_BLOCK)",
     "large-pool split threshold 1 MiB -> 512 B"),
    ("resources/paged_kv.py", "return 0 <= n <= len(self._free)", "return 0 <= n < len(self._free)",
     "can_allocate off by one"),
    ("graphc/passes/tally_ledger.py", "key=lambda k: (-s.acts.graphs[k][1].peak_bytes,",
     "key=lambda k: (s.acts.graphs[k][1].peak_bytes,", "graphs captured smallest first"),
    ("graphc/passes/choose_buckets.py", "captured.setdefault(key, set()).update(cap)", "captured[key] = set(cap)",
     "a family's rungs overwritten instead of merged"),
    ("graphc/passes/tally_ledger.py", "transient = FLASHINFER_TRANSIENT_INT_WORKSPACE if wrappers else 0",
     "transient = 0", "FlashInfer's 8 MiB transient int workspace dropped"),
]
HAND_SWAP: list[tuple[str, str, str, str]] = [  # two-site mutants: swap two texts in one file
]


@dataclass
class Mutant:
    file: str
    line: int
    what: str
    source: str          # the whole mutated file
    lines: tuple[int, int]
    status: str = ""     # killed | survived | timeout | uncovered | error
    by: str = ""         # the test that failed first
    seconds: float = 0.0


# --- generating mutants -----------------------------------------------------------------------

CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
       ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
       ast.Mod: ast.Div, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
       ast.BitOr: ast.BitAnd}
QUIET_CALLS = {"print", "tqdm"}


class _Spans:
    """Byte offsets of AST nodes in a source file."""

    def __init__(self, source: str):
        self.data = source.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def replace(self, node: ast.AST, text: str) -> str:
        a = self.starts[node.lineno - 1] + node.col_offset
        b = self.starts[node.end_lineno - 1] + node.end_col_offset
        return (self.data[:a] + text.encode() + self.data[b:]).decode()

    def text(self, node: ast.AST) -> str:
        a = self.starts[node.lineno - 1] + node.col_offset
        b = self.starts[node.end_lineno - 1] + node.end_col_offset
        return self.data[a:b].decode()


def _quiet(tree: ast.AST) -> set[int]:
    """ids of nodes inside messages (f-strings, raise statements, docstrings, print/tqdm calls),
    annotations (never evaluated under `from __future__ import annotations`) and decorators."""
    out: set[int] = set()
    for n in ast.walk(tree):
        notes = [n.annotation] if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation is not None else []
        notes += [n.returns] if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns else []
        # decorators: dataclass(frozen=True) and the like change nothing unless code breaks the rule
        notes += n.decorator_list if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []
        for a in notes:
            out.update(id(m) for m in ast.walk(a))
        inside = isinstance(n, (ast.JoinedStr, ast.Raise))
        inside |= isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in QUIET_CALLS
        inside |= isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        if isinstance(n, ast.Assert) and n.msg is not None:
            out.update(id(m) for m in ast.walk(n.msg))
        if inside:
            out.update(id(m) for m in ast.walk(n))
    return out


def _keyed_strings(tree: ast.AST) -> set[int]:
    """String constants that decide behaviour: compared, used as a key, or looked up."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            out.update(id(x) for x in [n.left, *n.comparators] for x in ast.walk(x) if isinstance(x, ast.Constant))
        elif isinstance(n, ast.Subscript):
            out.add(id(n.slice))
        elif isinstance(n, ast.Dict):
            out.update(id(k) for k in n.keys if k is not None)
    return out


def _variants(n: ast.AST, keyed: set[int]):
    """(mutated copy of n, description) for each mutation of this node."""
    if isinstance(n, ast.Compare):
        for i, op in enumerate(n.ops):
            if type(op) in CMP:
                m = copy.deepcopy(n)
                m.ops[i] = CMP[type(op)]()
                yield m, f"{type(op).__name__} -> {CMP[type(op)].__name__}"
    elif isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in BIN:
        m = copy.deepcopy(n)
        m.op = BIN[type(n.op)]()
        yield m, f"{type(n.op).__name__} -> {BIN[type(n.op)].__name__}"
    elif isinstance(n, ast.BoolOp):
        m = copy.deepcopy(n)
        m.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
        yield m, f"{type(n.op).__name__} -> {type(m.op).__name__}"
    elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Not, ast.USub)):
        yield n.operand, f"{type(n.op).__name__} dropped"
    elif isinstance(n, ast.Constant):
        v = n.value
        if isinstance(v, bool):
            yield ast.Constant(not v), f"{v} -> {not v}"
        elif isinstance(v, (int, float)):
            yield ast.Constant(v + 1), f"{v!r} -> {v + 1!r}"
        elif isinstance(v, str) and id(n) in keyed:
            yield ast.Constant("XX" + v + "XX"), f"{v!r} -> 'XX{v}XX'"
    elif isinstance(n, ast.Name) and n.id in ("min", "max"):
        yield ast.Name("max" if n.id == "min" else "min"), f"{n.id} -> {'max' if n.id == 'min' else 'min'}"
    elif isinstance(n, (ast.Break, ast.Continue)):
        yield (ast.Continue() if isinstance(n, ast.Break) else ast.Break()), f"{type(n).__name__} swapped"


def mutants_of(path: str) -> list[Mutant]:
    source = (ROOT / path).read_text()
    tree = ast.parse(source)
    spans, quiet, keyed = _Spans(source), _quiet(tree), _keyed_strings(tree)
    out, seen = [], set()
    for n in ast.walk(tree):
        if id(n) in quiet or not hasattr(n, "lineno"):
            continue
        for m, what in _variants(n, keyed):
            text = ast.unparse(m)
            if isinstance(n, ast.expr):
                text = f"({text})"
            new = spans.replace(n, text)
            try:
                if ast.dump(ast.parse(new)) == ast.dump(tree):
                    continue
            except SyntaxError:
                continue
            if new in seen:
                continue
            seen.add(new)
            out.append(Mutant(path, n.lineno, f"{what}: {spans.text(n)[:60]}", new, (n.lineno, n.end_lineno)))
    return out


def hand_mutants() -> list[Mutant]:
    out = []
    for path, old, new, what in HAND:
        src = (ROOT / path).read_text()
        if src.count(old) != 1:
            raise SystemExit(f"hand mutant '{what}': {old!r} occurs {src.count(old)} times in {path}")
        line = src[:src.index(old)].count("\n") + 1
        out.append(Mutant(path, line, f"[named] {what}", src.replace(old, new), (line, line)))
    for path, a, b, what in HAND_SWAP:
        src = (ROOT / path).read_text()
        if src.count(a) != 1 or src.count(b) != 1:
            raise SystemExit(f"hand mutant '{what}': expected one {a!r} and one {b!r} in {path}")
        line = src[:src.index(a)].count("\n") + 1
        swapped = src.replace(a, "\0").replace(b, a).replace("\0", b)
        out.append(Mutant(path, line, f"[named] {what}", swapped, (line, src[:src.index(b)].count("\n") + 1)))
    return out


def target_files(args: list[str]) -> list[str]:
    files = []
    for t in args or TARGETS:
        p = ROOT / t
        files += sorted(str(f.relative_to(ROOT)) for f in p.glob("*.py")) if p.is_dir() else [t]
    return [f for f in files if not f.endswith("__init__.py")]


# --- which tests cover what --------------------------------------------------------------------

COVER = r'''
import json, sys, coverage, pytest
files, out = json.loads(sys.argv[1]), sys.argv[2]
cov = coverage.Coverage(data_file=None, include=files)
durations = {}
class Plugin:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        memo = sys.modules.get("graphc.memo")
        if memo is not None:      # each test runs what it needs, not what an earlier one memoized
            memo.clear()
        cov.switch_context(item.nodeid)
        yield
        cov.switch_context("")
    def pytest_runtest_logreport(self, report):
        durations[report.nodeid] = durations.get(report.nodeid, 0.0) + report.duration
cov.start()
rc = pytest.main(sys.argv[3:], plugins=[Plugin()])
cov.stop()
data = cov.get_data()
lines = {f: {str(k): sorted(v) for k, v in data.contexts_by_lineno(f).items()} for f in data.measured_files()}
json.dump({"rc": int(rc), "durations": durations, "lines": lines}, open(out, "w"))
'''


def coverage_map(files: list[str]) -> tuple[dict, dict]:
    """({file: {line: [test ids]}}, {test id: seconds}) from one run of the selected tests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cov.json"
        cmd = [sys.executable, "-c", COVER, json.dumps([str(ROOT / f) for f in files]), str(out), *TEST_DIRS,
               "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "addopts=", f"--ignore={RECORD_TEST}"]
        subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
        data = json.loads(out.read_text())
    if data["rc"] != 0:
        raise SystemExit("the unmutated tests fail: fix them before a mutation run")
    lines = {str(Path(f).relative_to(ROOT)): {int(k): [c for c in v if c] for k, v in ls.items()}
             for f, ls in data["lines"].items()}
    return lines, data["durations"]


def tests_for(m: Mutant, lines: dict, durations: dict) -> list[str]:
    """Every test of each test file that covers the mutated lines: a module-scoped fixture runs the
    code under test in its first test only, and the others use what it computed."""
    per_line = lines.get(m.file, {})
    ids = {t for ln in range(m.lines[0], m.lines[1] + 1) for t in per_line.get(ln, [])}
    if not ids:   # module-level code runs at import: every test that covers the file
        ids = {t for ts in per_line.values() for t in ts}
    files = {t.split("::")[0] for t in ids}
    ids = {t for t in durations if t.split("::")[0] in files}
    return sorted(ids, key=lambda t: (durations.get(t, 0.0), t))


# --- running mutants ---------------------------------------------------------------------------

def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).write_bytes(src.read_bytes())


def _run_one(tree: Path, m: Mutant, tests: list[str], limit: float) -> tuple[str, str]:
    target = tree / m.file
    original = target.read_bytes()
    target.write_text(m.source)
    first = tree / ".mutant_first_failure"
    first.unlink(missing_ok=True)
    try:
        pid = os.fork()
        if pid == 0:
            _child(tree, tests, first)
        t0 = time.monotonic()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - t0 > limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "timeout", ""
            time.sleep(0.05)
        rc = os.waitstatus_to_exitcode(status)
        if first.exists():        # a test failed, or a test module no longer imports
            return "killed", first.read_text()
        return ("survived", "") if rc == 0 else ("error", f"pytest exit {rc}")
    finally:
        target.write_bytes(original)


def _child(tree: Path, tests: list[str], first: Path) -> None:
    try:
        os.chdir(tree)
        sys.path.insert(0, str(tree))
        sys.dont_write_bytecode = True
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        import hypothesis
        import pytest

        hypothesis.settings.register_profile("mutation", database=None, derandomize=True, deadline=None)
        hypothesis.settings.load_profile("mutation")

        class First:
            def pytest_runtest_logreport(self, report):
                if report.failed and not first.exists():
                    first.write_text(report.nodeid)

            def pytest_collectreport(self, report):
                if report.failed and not first.exists():
                    first.write_text(f"{report.nodeid} (does not import)")

        rc = pytest.main([*tests, "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "addopts="],
                         plugins=[First()])
        os._exit(int(rc))
    except BaseException:
        os._exit(4)


def _worker(index: int, jobs: Queue, results: Queue, workdir: Path) -> None:
    for mod in PRELOAD:
        try:
            __import__(mod)
        except ImportError:
            pass
    tree = workdir / f"w{index}"
    tree.mkdir(parents=True)
    _copy_tree(tree)
    while True:
        job = jobs.get()
        if job is None:
            return
        i, m, tests, limit = job
        t0 = time.monotonic()
        status, by = _run_one(tree, m, tests, limit)
        results.put((i, status, by, time.monotonic() - t0))


def run(mutants: list[Mutant], lines: dict, durations: dict, workers: int) -> None:
    """Jobs go out one at a time, so each mutant's tests can be ordered by what killed its file's
    mutants so far (those first, most kills first), then by duration."""
    killers: dict[str, dict[str, int]] = {}
    pending = []
    for i, m in enumerate(mutants):
        tests = tests_for(m, lines, durations)
        if tests:
            pending.append((i, tests))
        else:
            m.status = "uncovered"
    jobs, results = Queue(), Queue()

    def dispatch() -> None:
        i, tests = pending.pop(0)
        kills = killers.get(mutants[i].file, {})
        tests = sorted(tests, key=lambda t: (-kills.get(t, 0), durations.get(t, 0.0)))
        limit = 60.0 + 4.0 * sum(durations.get(t, 1.0) for t in tests)   # generous: a loaded machine is slow
        jobs.put((i, mutants[i], tests, limit))

    todo = len(pending)
    with tempfile.TemporaryDirectory(prefix="graphc-mutation-") as tmp:
        procs = [Process(target=_worker, args=(w, jobs, results, Path(tmp))) for w in range(workers)]
        for p in procs:
            p.start()
        for _ in range(min(workers, len(pending))):
            dispatch()
        t0 = time.monotonic()
        for n in range(1, todo + 1):
            i, status, by, secs = results.get()
            if pending:
                dispatch()
            m = mutants[i]
            m.status, m.by, m.seconds = status, by, secs
            if status == "killed" and by:
                kills = killers.setdefault(m.file, {})
                kills[by] = kills.get(by, 0) + 1
            if status != "killed" or n % 25 == 0:
                print(f"[{n}/{todo} {time.monotonic() - t0:.0f}s] {status:9s} {m.file}:{m.line} {m.what}",
                      flush=True)
        for p in procs:
            jobs.put(None)
        for p in procs:
            p.join()


def summary(rows: list[dict]) -> str:
    """Markdown: the score per file, the named mutants, and every mutant that was not killed."""
    def caught(rs: list[dict]) -> int:
        return sum(r["status"] in ("killed", "timeout") for r in rs)

    out = ["| file | mutants | killed | score |", "|---|---|---|---|"]
    for f in sorted({r["file"] for r in rows}):
        rs = [r for r in rows if r["file"] == f]
        out.append(f"| {f} | {len(rs)} | {caught(rs)} | {100 * caught(rs) / len(rs):.1f}% |")
    out += [f"| **all** | {len(rows)} | {caught(rows)} | {100 * caught(rows) / len(rows):.1f}% |", "",
            "Named mutants (issue 9):", ""]
    out += [f"- {r['what'].removeprefix('[named] ')} ({r['file']}:{r['line']}): {r['status']}"
            + (f" by `{r['by']}`" if r["by"] else "") for r in rows if r["what"].startswith("[named]")]
    left = sorted((r for r in rows if r["status"] not in ("killed", "timeout")), key=lambda r: (r["file"], r["line"]))
    out += ["", f"Not killed ({len(left)}):", ""]
    out += [f"- {r['file']}:{r['line']} {r['status']}: `{r['what']}`" for r in left]
    return "\n".join(out) + "\n"


def blob(path: Path) -> str:
    """git's object id of a file's bytes, as `git hash-object` prints it."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _keys(rows: list[dict]) -> list[tuple]:
    """Each mutant's identity: file, line, what, and which of the mutants alike on that line it is
    (two `1` constants on one line read the same), counted in generation order, which a file's
    unchanged content fixes."""
    seen: dict[tuple, int] = {}
    out = []
    for m in rows:
        k = (m["file"], m["line"], m["what"])
        seen[k] = seen.get(k, -1) + 1
        out.append(k + (seen[k],))
    return out


def _text_keys(rows: list[dict], texts: dict[str, list[str]]) -> list[tuple]:
    """Each mutant by the text of the lines it mutates instead of their numbers (stripped), and which of
    the mutants alike on that text it is: a mutant on a line an edit elsewhere in the file only moved
    keeps its key."""
    seen: dict[tuple, int] = {}
    out = []
    for m in rows:
        a, b = m["lines"]
        k = (m["file"], "\n".join(x.strip() for x in texts[m["file"]][a - 1:b]), m["what"])
        seen[k] = seen.get(k, -1) + 1
        out.append(k + (seen[k],))
    return out


def _old_text(sha: str) -> list[str] | None:
    """A recorded file's lines, from git's object store (None where the object is not there)."""
    got = subprocess.run(["git", "cat-file", "-p", sha], cwd=ROOT, capture_output=True, text=True)
    return got.stdout.splitlines() if got.returncode == 0 else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help=f"files or folders to mutate (default: {' '.join(TARGETS)})")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every mutant's result here")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N mutants (a smoke test)")
    ap.add_argument("--update", type=Path, metavar="RECORD",
                    help="bring an earlier --json record up to date: in a file that changed since (or is new), "
                         "every mutant of a line whose text changed (the others keep their recorded result); "
                         "in the files given (default: all), the survivors again (tests only get stronger, so "
                         "what they killed stays killed); merged into one record")
    ap.add_argument("--named", action="store_true",
                    help="with paths: the named mutants of every file too, not only of the paths given")
    ap.add_argument("--tests", nargs="+", default=TEST_DIRS, help=f"test files or folders (default: {TEST_DIRS})")
    args = ap.parse_args(argv)
    TEST_DIRS[:] = args.tests
    files = target_files(args.paths)
    named = [m for m in hand_mutants() if m.file in files or not args.paths or args.named]
    mutants = named + [m for f in files for m in sorted(mutants_of(f), key=lambda m: m.line)]
    keyed = list(zip(_keys([asdict(m) for m in mutants]), mutants))
    earlier = json.loads(args.update.read_text()) if args.update else None
    if earlier:
        current = set(target_files([])) | {m.file for m in hand_mutants()}   # files not selected keep their rows
        gone = sorted(set(earlier["files"]) - current)       # no longer mutated (moved or removed): dropped
        earlier = {"files": {f: sha for f, sha in earlier["files"].items() if f in current},
                   "mutants": [m for m in earlier["mutants"] if m["file"] in current]}
        changed = {m.file for m in mutants if earlier["files"].get(m.file) != blob(ROOT / m.file)}
        left = {k for k, m in zip(_keys(earlier["mutants"]), earlier["mutants"])
                if m["status"] not in ("killed", "timeout")}
        # in a changed file, a mutant whose lines' text is as recorded (the edit only moved it) keeps what it
        # was recorded as; where git no longer has the recorded file, all run again
        old = {f: _old_text(earlier["files"][f]) for f in changed if f in earlier["files"]}
        old = {f: t for f, t in old.items() if t is not None}
        was = [r for r in earlier["mutants"] if r["file"] in old]
        # killed stays killed; a survivor stays a survivor (pessimistic: a plain run may kill it now)
        caught = dict(zip(_text_keys(was, old), was))
        new_text = {f: (ROOT / f).read_text().splitlines() for f in old}
        carried = []
        for k, m in keyed:
            if m.file in old:
                hit = caught.get(_text_keys([asdict(m)], new_text)[0])
                if hit is not None:
                    carried.append(hit | {"line": m.line, "lines": list(m.lines)})
        carried_keys = {(r["file"], r["line"], r["what"]) for r in carried}
        keyed = [(k, m) for k, m in keyed if (m.file in changed or k in left)
                 and (m.file, m.line, m.what) not in carried_keys]
        if args.paths:                               # the others' survivors stay as recorded
            keyed = [(k, m) for k, m in keyed if m.file in changed]
        print(f"changed since {args.update}: {', '.join(sorted(changed)) or 'nothing'}; "
              f"their mutants on changed lines run again ({len(carried)} on moved lines keep their record), "
              "of the others only the survivors"
              + (f"; no longer mutated, dropped: {', '.join(gone)}" if gone else ""), flush=True)
    if args.limit:
        keyed = keyed[:args.limit]
    run_keys, mutants = [k for k, _ in keyed], [m for _, m in keyed]
    print(f"{len(mutants)} mutants in {len(files)} files; mapping coverage ...", flush=True)
    lines, durations = coverage_map(sorted({m.file for m in mutants}))
    t0 = time.monotonic()
    run(mutants, lines, durations, args.workers)
    rows = [{k: v for k, v in asdict(m).items() if k != "source"} for m in mutants]
    files_sha = {f: blob(ROOT / f) for f in sorted({m.file for m in mutants})}
    if earlier:
        again = dict(zip(run_keys, rows))
        kept = [again.pop(k, r) for k, r in zip(_keys(earlier["mutants"]), earlier["mutants"])
                if r["file"] not in changed]
        rows = kept + carried + list(again.values())
        files_sha = {f: sha for f, sha in earlier["files"].items() if f not in changed} | {f: blob(ROOT / f) for f in changed}
    print(f"\n{time.monotonic() - t0:.0f} s\n\n{summary(rows)}")
    if args.json:
        args.json.write_text(json.dumps({"files": files_sha, "mutants": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
