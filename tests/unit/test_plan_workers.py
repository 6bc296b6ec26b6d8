"""Steps traced on a pool of forked workers (simulate_steps.prefetch on graphc/forkpool.py, issue 14) give the
traces this process gives (a trace is a pure function of its key), and the pool really ran; a bad
GRAPHC_PLAN_WORKERS is refused with the fix. The tiny model on an h100 target, the disk cache off."""
import sys

import pytest

from graphc import forkpool, memo
from graphc.errors import InvalidInput
from graphc.passes import simulate_steps as ss
from graphc.passes.choose_buckets import choose_buckets
from graphc.passes.select_backends import select_backends
from graphc.source import load_model
from graphc.targets import get_target
from graphc.verify import verify_graph


@pytest.mark.skipif(sys.platform != "linux", reason="the pool forks (Linux only)")
def test_forked_workers_trace_what_this_process_traces(monkeypatch):
    ir = verify_graph(load_model("models/tiny_omni.py").model, get_target("h100"), 1)
    buckets, backends = choose_buckets(ir), select_backends(ir)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", "off")
    ran = []
    real = ss.prefetch
    monkeypatch.setattr(ss, "prefetch", lambda *a: ran.append(real(*a)) or ran[-1])

    memo.clear()
    monkeypatch.setenv("GRAPHC_PLAN_WORKERS", "2")
    here_too = []                                  # traces this process made itself while the pool ran
    compute = ss._compute
    monkeypatch.setattr(ss, "_compute", lambda *a: here_too.append(a) or compute(*a))
    pooled = ss.simulate_steps(ir, buckets, backends)
    monkeypatch.setattr(ss, "_compute", compute)
    assert not here_too                            # every trace came from the pool, into the memo
    memo.clear()
    monkeypatch.setenv("GRAPHC_PLAN_WORKERS", "1")
    here = ss.simulate_steps(ir, buckets, backends)
    memo.clear()
    assert len(ran[0]) >= forkpool.MIN_JOBS and not ran[1]       # the pool traced; then nothing was pooled
    assert pooled.graphs == here.graphs and pooled.eager == here.eager and pooled.io == here.io
    assert pooled.uncalibrated == here.uncalibrated


def test_a_bad_worker_count_is_refused(monkeypatch):
    monkeypatch.setenv("GRAPHC_PLAN_WORKERS", "two")
    with pytest.raises(InvalidInput, match="GRAPHC_PLAN_WORKERS='two' is not a number") as e:
        forkpool.workers()
    assert "1: no pool" in str(e.value)
    monkeypatch.setenv("GRAPHC_PLAN_WORKERS", "0")
    assert forkpool.workers() == 1 and forkpool.size(100) == 0            # one worker: no pool
    monkeypatch.setenv("GRAPHC_PLAN_WORKERS", "4")
    assert forkpool.size(forkpool.MIN_JOBS - 1) == 0 and forkpool.size(3 * forkpool.MIN_JOBS) == 4
