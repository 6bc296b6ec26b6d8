"""Kernel prebuild jobs from a plan, and cuDNN workspaces entering a trace."""
import torch
import torch.nn.functional as F

from graphc import convws
from graphc.plan import load_plan
from graphc.runtime.boot import plan_ir
from graphc.runtime.kernels import kernel_jobs
from graphc.simulate import _Recorder
from graphc.trace import Trace


def test_tiny_plan_needs_one_prefill_module():
    plan = load_plan("plans/tiny_h100.plan")
    jobs = kernel_jobs(plan, plan_ir(plan), [0])
    # the encoder's fa3 ragged prefill shares the decoder's fa3 paged prefill module (head dim 64);
    # the paged job is kept so the page (append) module is built too; decode runs on triton (no FlashInfer module)
    assert plan.resources["decoder_kv"].decode_backend == "triton"
    assert [(j.resource, j.phase, j.backend) for j in jobs] == [("decoder_kv", "prefill", "fa3")]


def test_cpu_plan_needs_no_kernels():
    plan = load_plan("plans/tiny_cpu.plan")
    assert kernel_jobs(plan, plan_ir(plan), [0]) == []


def _conv_trace() -> Trace:
    rec = _Recorder([])
    with rec, torch.no_grad():
        x = torch.empty(1, 4, 16, device="meta")
        y = F.conv1d(x, torch.empty(8, 4, 3, device="meta"))
        del x
        z = y + 1
        del y, z
    return Trace(tuple(rec.events), rec.peak, 0, rec.ops, rec.launches, tuple(rec.convs))


def test_measured_workspace_is_allocated_where_the_convolution_runs(monkeypatch):
    t = _conv_trace()
    (at, sig), = t.convs
    assert sig == "conv x[1,4,16] w[8,4,3] float32 s1 p0 d1 op0 g1"
    monkeypatch.setattr(convws, "workspaces", lambda arch: {sig: 10_000})
    out, missing = convws.resolve(t, "sm_90")
    assert not missing
    assert out.events[at:at + 2] == ((1, -1, 10_000), (0, -1, 10_000))
    # the output (8 x 14 floats) and both inputs are live while the workspace is
    assert out.peak_bytes == 4 * (64 + 96 + 112) + 10_000


def test_unmeasured_convolution_is_reported_and_counts_as_none(monkeypatch):
    t = _conv_trace()
    monkeypatch.setattr(convws, "workspaces", lambda arch: {})
    out, missing = convws.resolve(t, "sm_90")
    assert missing == {t.convs[0][1]} and out.events == t.events and out.peak_bytes == t.peak_bytes
