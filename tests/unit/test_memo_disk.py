"""The compiler's disk memo (graphc/memo.py, issue 14): a second process reads what the first computed
and makes the same plan byte for byte; any change to the code misses every entry; an entry that does not
read back (truncated, or not a trace's types) is a miss, never executed; two plans at once each see
whole entries; GRAPHC_CACHE_DIR=off writes nothing. The plans compared come from a process with the
cache off (the expected bytes do not come from the cache)."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from graphc import memo
from graphc.declare import ModuleRef

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from graphc import memo
from graphc.declare import Node
from graphc.pipeline import compile_model
from graphc.source import load_model
built = []
build = Node.build
Node.build = lambda self: built.append(self.name) or build(self)       # every module built, by node
plan = compile_model(load_model(sys.argv[1] + "/models/tiny_omni.py"), "h100").plan
plan.save(sys.argv[2])
t = memo.table("simulate_steps.traces")
print(json.dumps({"hits": t.hits, "writes": t.writes, "entries": len(t), "built": len(built),
                  "torch": "torch" in sys.modules}))
"""


def plan_in_a_process(cache, out: Path, wait=True):
    env = dict(os.environ, GRAPHC_CACHE_DIR=str(cache))
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ROOT), str(out)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    return finish(p)


def finish(p) -> dict:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_process_reads_what_the_first_computed(tmp_path):
    cache = tmp_path / "cache"
    cold = plan_in_a_process("off", tmp_path / "cold.plan")
    assert cold["writes"] == 0 and cold["hits"] == 0 and not cache.exists()
    first = plan_in_a_process(cache, tmp_path / "first.plan")
    second = plan_in_a_process(cache, tmp_path / "second.plan")
    assert first["hits"] == 0 and first["writes"] == first["entries"] > 0
    assert second["hits"] == first["entries"] and second["writes"] == 0
    assert first["built"] > 0 and second["built"] == 0       # from the cache, no module is built at all
    assert first["torch"] and not second["torch"]            # nor is torch imported
    reference = (tmp_path / "cold.plan").read_bytes()
    assert (tmp_path / "first.plan").read_bytes() == reference == (tmp_path / "second.plan").read_bytes()

    # truncated entries and a pickle that would run code: misses, written again, the plan unchanged
    files = sorted((cache / "simulate_steps.traces").rglob("*.pkl"))
    assert len(files) == first["entries"]
    for f in files[: len(files) // 2]:
        f.write_bytes(f.read_bytes()[:7])
    files[-1].write_bytes(pickle.dumps(os.system))
    third = plan_in_a_process(cache, tmp_path / "third.plan")
    assert third["writes"] == len(files) // 2 + 1 and third["hits"] == first["entries"] - third["writes"]
    assert (tmp_path / "third.plan").read_bytes() == reference


def test_two_plans_at_once_share_the_directory(tmp_path):
    cache = tmp_path / "cache"
    procs = [plan_in_a_process(cache, tmp_path / f"{i}.plan", wait=False) for i in range(2)]
    stats = [finish(p) for p in procs]
    assert all(s["entries"] > 0 for s in stats)
    assert (tmp_path / "0.plan").read_bytes() == (tmp_path / "1.plan").read_bytes()
    assert not list(cache.rglob(".tmp-*"))                       # every write renamed into place


def test_a_change_to_the_code_misses_every_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    t = memo.DiskMemo("test.table")
    key = ("a key", 1)
    t[key] = (1, 2)
    fresh = memo.DiskMemo("test.table")
    assert key in fresh and fresh[key] == (1, 2) and fresh.hits == 1
    extra = tmp_path / "edited.py"
    extra.write_text("x = 1\n")
    sources = memo._sources()
    monkeypatch.setattr(memo, "_sources", lambda: sources + [extra])
    memo._FINGERPRINTS.clear()
    before = memo.DiskMemo("test.table")
    before[key] = (3, 4)                                          # stored under the new fingerprint
    extra.write_text("x = 2\n")                                   # one byte of the code changes
    memo._FINGERPRINTS.clear()
    after = memo.DiskMemo("test.table")
    assert key not in after and after.misses == 1
    memo._FINGERPRINTS.clear()


def test_a_model_file_class_is_fingerprinted_by_its_own_file(tmp_path):
    src = tmp_path / "user_model.py"
    src.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    ns = {}
    exec(compile(src.read_text(), str(src), "exec"), ns)         # defined outside sys.modules, as load_model does
    assert str(src) in memo._defining_files(((ns["M"], "config"), "sizes"))


def test_a_module_named_by_import_path_is_fingerprinted_by_its_package_unimported(tmp_path, monkeypatch):
    pkg = tmp_path / "refpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "base.py").write_text("import torch\nclass Base(torch.nn.Module):\n    pass\n")
    (pkg / "sub" / "mod.py").write_text("from refpkg.base import Base\nclass M(Base):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = ModuleRef.parse("refpkg.sub.mod:M")
    files = memo._defining_files((ref, "config"))
    assert {str(pkg / "base.py"), str(pkg / "sub" / "mod.py")} <= set(files)     # the base's file too
    assert "refpkg.sub.mod" not in sys.modules                                   # read, not imported
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    memo.DiskMemo("test.refs")[(ref,)] = (1,)
    assert (ref,) in memo.DiskMemo("test.refs")
    (pkg / "base.py").write_text("import torch\nclass Base(torch.nn.Module):\n    x = 1\n")   # the base changes
    memo._FINGERPRINTS.clear()
    assert (ref,) not in memo.DiskMemo("test.refs")
    memo._FINGERPRINTS.clear()
    assert ref.resolve().__name__ == "M"


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", "off")
    t = memo.DiskMemo("test.table")
    t[("k",)] = 1
    assert memo.cache_dir() is None and t.writes == 0 and ("k",) in t


def test_a_trace_reads_back_whole_from_the_disk_memo(tmp_path, monkeypatch):
    """Trace's own pickling (its events in one int64 array, its digest kept): what the disk memo reads back
    equals what was written, event for event, and its digest is the one its events give when computed afresh;
    a value past int64 still round-trips (as tuples)."""
    from graphc.trace import Trace

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    events = tuple((i % 2, i // 2, 256 * (i + 1) + 2**40 * (i % 3)) for i in range(1001))
    traces = [Trace(events, 7, 3, 1001, 12, ((4, "conv a"), (9, "conv b"))), Trace(((1, 0, 2**64),), 1, 0, 1)]
    table = memo.DiskMemo("test.traces")
    for i, t in enumerate(traces):
        table[("trace", i)] = (t, frozenset({"x"}))
    fresh = memo.DiskMemo("test.traces")
    for i, t in enumerate(traces):
        assert ("trace", i) in fresh and fresh.hits == i + 1
        got, tags = fresh[("trace", i)]
        assert "digest" in vars(got), "the digest is read back, not computed again"
        assert got == t and type(got.events) is tuple and all(type(e) is tuple for e in got.events)
        assert tags == frozenset({"x"})
        assert got.digest == Trace(t.events, 0, 0, 0).digest                # the events' own digest


def test_reports_compile_their_templates_once_into_the_cache(tmp_path):
    """`graphc explain` in a process with the cache at tmp_path writes its template's compiled form there; a
    second process reads it and prints the same text as a process with the cache off, which writes nothing."""
    cmd = [sys.executable, "-m", "graphc.cli", "explain", "plans/tiny_h100.plan"]

    def explain(cache) -> str:
        done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, GRAPHC_CACHE_DIR=str(cache)), capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    off = explain("off")
    first = explain(tmp_path)
    compiled = sorted((tmp_path / "templates").iterdir())
    assert len(compiled) == 1 and compiled[0].stat().st_size > 0
    stamp = compiled[0].stat().st_mtime_ns
    assert explain(tmp_path) == first == off
    assert compiled[0].stat().st_mtime_ns == stamp, "read, not written again"


def test_a_report_renders_where_the_cache_takes_no_file(tmp_path, monkeypatch):
    """A cache directory that cannot be made (a file in its place) or that takes no file: the report renders,
    uncached."""
    import jinja2.bccache

    from graphc import report
    from graphc.plan import load_plan

    plan = load_plan(ROOT / "plans/tiny_h100.plan")
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "templates").write_text("a file where the directory would be")
    want = None
    for case in ("blocked", "no file"):
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / case))
        if case == "no file":
            def refuse(*args, **kwargs):
                raise OSError(28, "No space left on device")
            monkeypatch.setattr(jinja2.bccache.tempfile, "NamedTemporaryFile", refuse)
        report._env.cache_clear()
        try:
            text = report.explain(plan)
        finally:
            report._env.cache_clear()
        assert text == (want := want or text) and "device" in text
    assert not any((tmp_path / "no file" / "templates").iterdir())
