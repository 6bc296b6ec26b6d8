"""Compile a plan's FlashInfer kernel modules up front, in parallel, before the boot needs them.

FlashInfer builds each kernel family on its first use (an fa3 prefill module takes minutes), so a
boot on a fresh machine would otherwise compile them one after another, mid-warm-up. Here each
distinct (resource kind, phase, backend, head dim, window) the plan's devices use becomes one job;
a child process runs that backend once on a tiny eager layout, which builds (or loads) exactly the
modules the boot will load, and the jobs run side by side with ninja's parallelism split between
them. Children hold their own CUDA contexts and exit before the boot measures anything.

    python -m graphc.runtime.kernels JOB_JSON     # one job (what warm() starts)
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from graphc.ir import IR
from graphc.plan import Plan
from graphc.runtime.progress import BootProgress
from resources.capabilities import flashinfer_modules, phases
from resources.paged_kv import PagedKVSpec, new_cache
from resources.ragged_attention import RaggedAttentionSpec


@dataclass(frozen=True)
class KernelJob:
    """One backend run once: what FlashInfer compiles a module (or two) for."""

    resource: str             # the plan's resource name (for messages)
    kind: str                 # ragged_attention | paged_kv
    phase: str                # ragged | prefill | decode
    backend: str              # the backend of this phase
    spec: str                 # the resource spec as JSON (the child rebuilds it)
    run_head_dim: int | None  # ragged head dims a kernel lacks run padded to this
    decode_backend: str | None = None

    def resource_spec(self) -> RaggedAttentionSpec | PagedKVSpec:
        cls = RaggedAttentionSpec if self.kind == "ragged_attention" else PagedKVSpec
        return cls.model_validate_json(self.spec)

    def modules(self) -> tuple[str, ...]:
        """The FlashInfer modules this run builds or loads (resources.capabilities)."""
        return flashinfer_modules(self.resource_spec(), self.phase, self.backend, self.run_head_dim)

    def label(self) -> str:
        return f"{self.resource} {self.phase} {self.backend}"


def kernel_jobs(plan: Plan, ir: IR, devices: list[int]) -> list[KernelJob]:
    """The distinct FlashInfer backend runs the plan's devices need, in a stable order."""
    resources = []
    for d in devices:
        for node in plan.devices[d].nodes:
            resources += [r for r in ir.node(node).resources.values() if r not in resources]
    jobs = []
    # paged resources first: where a ragged job loads the same prefill module, the paged job, which
    # also builds the page (append) module, is the one kept
    for res in sorted(resources, key=lambda r: ir.model.resource(r).kind != "paged_kv"):
        spec, chosen = ir.model.resource(res), plan.resources.get(res)
        if chosen is None or chosen.backend in (None, "torch") or spec.kind not in ("ragged_attention", "paged_kv"):
            continue
        jobs += [KernelJob(res, spec.kind, phase, backend, spec.model_dump_json(), chosen.run_head_dim,
                           chosen.decode_backend)
                 for phase, backend in phases(spec, chosen.backend, chosen.decode_backend)]
    return distinct(jobs)


def distinct(jobs: list[KernelJob]) -> list[KernelJob]:
    """The jobs that build a module no earlier job builds (several plans' jobs may be warmed together)."""
    seen: set[str] = set()
    kept = []
    for job in jobs:
        new = set(job.modules()) - seen
        if new:
            kept.append(job)
            seen |= new
    return kept


def run_job(job: KernelJob) -> None:
    """Build the job's backend eagerly and run one tiny step: FlashInfer compiles what it loads."""
    import torch

    from resources.flashinfer_backend import make_backend

    dev = torch.device("cuda", 0)
    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, device=dev)

    spec = job.resource_spec()
    if job.kind == "ragged_attention":
        b = make_backend(spec, job.backend, workspace, False, None, run_head_dim=job.run_head_dim)
        b.plan([0, 16])
        b(rand(16, spec.num_heads, spec.head_dim), rand(16, spec.kv_heads, spec.head_dim),
          rand(16, spec.kv_heads, spec.head_dim))
    else:
        spec = spec.model_copy(update={"num_layers": 1})
        cache = new_cache(spec, 4, dev)
        b = make_backend(spec, job.backend, workspace, False, None, cache=cache, decode_backend=job.decode_backend)
        rows = 1 if job.phase == "decode" else 8
        b.plan([rows], [spec.page_size + rows], [[0, 1, 2, 3]])
        b(0, rand(rows, spec.num_qo_heads, spec.head_dim), rand(rows, spec.num_kv_heads, spec.head_dim),
          rand(rows, spec.num_kv_heads, spec.head_dim))
    torch.cuda.synchronize()


def warm(jobs: list[KernelJob], cpus: int | None = None, gpu: int = 0,
         progress: BootProgress | None = None) -> dict[str, float]:
    """Run the jobs in parallel child processes that see only CUDA device `gpu` (the one the boot is for:
    another may be full, and a context there would not fit); {job label: seconds}. Raises with the child's
    error when a module fails to build or run. progress: where the `kernels` phase is reported (the boot's)."""
    if not jobs:
        return {}
    cpus = cpus or os.cpu_count() or 2
    # ninja's jobs split between the children; nvcc's memory per job keeps this bounded
    env = {**os.environ, "MAX_JOBS": str(max(2, math.ceil(1.5 * cpus / len(jobs)))),
           "CUDA_VISIBLE_DEVICES": only_device(gpu)}
    start = time.perf_counter()
    procs = {job.label(): subprocess.Popen([sys.executable, "-m", "graphc.runtime.kernels", json.dumps(asdict(job))],
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for job in jobs}
    seconds: dict[str, float] = {}
    failed: list[str] = []
    with (progress or BootProgress()).phase("kernels", len(jobs), "job", "built or loaded") as bar:
        while procs:
            for label, proc in list(procs.items()):
                if proc.poll() is None:
                    continue
                out = proc.stdout.read()
                del procs[label]
                seconds[label] = time.perf_counter() - start
                if proc.returncode:
                    failed.append(f"{label}: exit {proc.returncode}\n{out[-3000:]}")
                bar.update(1)
            time.sleep(0.2)
        if failed:                              # raised inside the phase: it is not reported as done
            raise RuntimeError("FlashInfer kernels failed to build or run:\n" + "\n".join(failed))
    return seconds


def _main(argv: list[str]) -> int:
    run_job(KernelJob(**json.loads(argv[0])))
    return 0


def only_device(gpu: int) -> str:
    """CUDA_VISIBLE_DEVICES for a child that should see this process's CUDA device `gpu` alone."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is None or not seen.strip():
        return str(gpu)
    return [x.strip() for x in seen.split(",")][gpu]


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
