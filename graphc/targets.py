"""The target catalog: each GPU's memory, arch and SM count, plus `cpu`; calibrated reserves."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources as ilr

from pydantic import Field

from graphc.errors import InvalidInput
from graphc.strict import Strict, closest, read_yaml
from graphc.units import GiB


class Target(Strict):
    """One device kind as the compiler sees it (all devices of a plan are the same kind)."""

    name: str
    arch: str                      # 'sm_90', ..., or 'cpu'
    memory_bytes: int = Field(gt=0)  # what cudaMemGetInfo reports as total on this card
    num_sms: int = Field(ge=0)
    memory_source: str
    capture: bool = True           # CUDA graphs exist on this target
    # devices that live in one host's memory (cpu): that host's budget, which the plan's devices split;
    # memory_bytes is then one device's share (get_target(..., devices=N))
    host_bytes: int | None = Field(None, gt=0)

    @property
    def is_gpu(self) -> bool:
        return self.arch != "cpu"

    def budget_bytes(self) -> int:
        """What --memory-cap caps: the host's budget for host-bound devices, else one card's memory."""
        return self.host_bytes if self.host_bytes is not None else self.memory_bytes


def _gib(x: float) -> int:
    return int(round(x * GiB))


# Totals are what torch reports for the card (cudaMemGetInfo total): the h100's measured to the byte, the others
# from public reports at 0.01 GiB (a card a few MiB under its figure refuses its plans: measure the card).
# Less than the marketing figure and than nvidia-smi's total: the driver keeps the rest.
CATALOG: dict[str, Target] = {t.name: t for t in [
    Target(name="h100", arch="sm_90", memory_bytes=85_017_493_504, num_sms=132,
           memory_source="H100 SXM 80GB HBM3: torch reports 85,017,493,504 B total (79.179 GiB; measured, "
                         "driver 580.159.04)"),
    Target(name="h200", arch="sm_90", memory_bytes=_gib(139.80), num_sms=132,
           memory_source="H200 SXM 141GB: torch reports 139.80 GiB total (public OOM reports)"),
    Target(name="a100-80gb", arch="sm_80", memory_bytes=_gib(79.15), num_sms=108,
           memory_source="A100 SXM 80GB: torch reports 79.15 GiB total (public OOM reports)"),
    Target(name="a100-40gb", arch="sm_80", memory_bytes=_gib(39.39), num_sms=108,
           memory_source="A100 40GB: torch reports 39.39 GiB total (public OOM reports)"),
    Target(name="l40s", arch="sm_89", memory_bytes=_gib(44.39), num_sms=142,
           memory_source="L40S 48GB with ECC: torch reports 44.39 GiB total (public OOM reports)"),
    Target(name="b200", arch="sm_100", memory_bytes=_gib(178.35), num_sms=148,
           memory_source="B200 180GB: torch reports 178.35 GiB total (public OOM reports)"),
    Target(name="b300", arch="sm_103", memory_bytes=_gib(267.69), num_sms=148,
           memory_source="B300 SXM6 288GB: torch reports 267.69 GiB total (public OOM reports)"),
    Target(name="cpu", arch="cpu", memory_bytes=8 * GiB, host_bytes=8 * GiB, num_sms=0, capture=False,
           memory_source="cpu: an 8 GiB default host budget, room on a 16 GB machine (set another with "
                         "--memory-cap; `graphc run` refuses a plan that asks more than the host has available)"),
]}


def get_target(name: str, memory_cap: int | None = None, devices: int = 1) -> Target:
    """A catalog target, optionally capped to emulate a smaller card (the cap must be smaller), for a plan of
    `devices` devices: host-bound devices (cpu) split the host's budget, which a cap replaces."""
    target = _capped(name, memory_cap)
    return target if target.host_bytes is None else split_host(target, devices)


def split_host(target: Target, devices: int) -> Target:
    """Host-bound devices share their host's budget evenly: each gets host_bytes // devices, so their planned
    bytes together stay within the host's."""
    if devices < 1:
        raise InvalidInput(f"{devices} devices", "a plan has at least one device", "pass --gpus 1 or more")
    each = target.host_bytes // devices
    return target.model_copy(update={"memory_bytes": each, "memory_source": (
        f"{target.memory_source}; split evenly over the host's {devices} device{'s' if devices > 1 else ''}: "
        f"{target.host_bytes:,} B // {devices} = {each:,} B each")})


def _capped(name: str, memory_cap: int | None) -> Target:
    key = name.lower()
    if key not in CATALOG:
        hint = closest(key, list(CATALOG))
        raise InvalidInput(f"unknown target GPU '{name}'", f"the catalog has: {', '.join(CATALOG)}",
                           f"use --gpu {hint}" if hint else "pick one of the catalog's names")
    target = CATALOG[key]
    if memory_cap is None:
        return target
    if memory_cap <= 0:
        raise InvalidInput(f"--memory-cap {memory_cap} must be positive")
    if target.is_gpu and memory_cap > target.memory_bytes:
        raise InvalidInput(
            f"--memory-cap {memory_cap / GiB:.2f} GiB is more than {name}'s {target.memory_bytes / GiB:.2f} GiB",
            "a cap emulates a smaller card; it cannot add memory",
            f"use a cap below {target.memory_bytes} bytes or a larger --gpu")
    if target.host_bytes is not None:
        return target.model_copy(update={"memory_bytes": memory_cap, "host_bytes": memory_cap, "memory_source": (
            f"{target.name}: a host budget of {memory_cap / GiB:.2f} GiB set by --memory-cap")})
    return target.model_copy(update={
        "memory_bytes": memory_cap,
        "memory_source": f"capped by --memory-cap to {memory_cap / GiB:.2f} GiB ({target.memory_source})"})


class Calibration(Strict):
    context_bytes: int
    library_bytes: int
    kernels_base_bytes: int     # kernel code loaded and driver reserves after the first launches
    graph_launch_bytes: int     # device memory per kernel launch held in an instantiated CUDA graph
    source: str
    host_base_bytes: int = 0    # a GPU worker's own host memory: CUDA's host side, torch, the kernel libraries
    host_launch_bytes: int = 0  # host memory per kernel launch of its captured graphs (and what comes with them)
    host_source: str = ""
    kernels_source: str = ""    # where kernels_base_bytes and graph_launch_bytes come from (else: source)


def package_yaml(name: str) -> dict | None:
    """One of graphc's own data files (None where it is absent), read as plans are (strict.read_yaml: libyaml
    where PyYAML has it; the conv-workspace table took 0.3 s a plan through PyYAML's Python parser)."""
    path = ilr.files("graphc").joinpath(name)
    if not path.is_file():
        return None
    return read_yaml(path.read_text(), f"graphc's {name}", "reinstall graphc: the file ships with it")


@lru_cache(maxsize=None)
def _calibration_table() -> dict:
    return package_yaml("calibration.yaml")["entries"]


def calibration(target: Target) -> Calibration:
    """The calibrated reserves for a target's arch, with where they were measured."""
    table = _calibration_table()
    entry = table.get(target.arch)
    note = ""
    if entry is None:
        entry = table["sm_90"]
        note = f"not measured on {target.arch}; using the sm_90 measurement. "
    m = entry["measured"]
    source = note + f"measured on {m['device']} on {m['date']}" + (
        f" (driver {m['driver']}, torch {m['torch']})" if "driver" in m else "") + f": {m['how']}"
    host = entry.get("host", {})
    return Calibration(context_bytes=entry["context_bytes"], library_bytes=entry["library_bytes"],
                       kernels_base_bytes=entry["kernels_base_bytes"], graph_launch_bytes=entry["graph_launch_bytes"],
                       source=source, host_base_bytes=host.get("base_bytes", 0),
                       host_launch_bytes=host.get("launch_bytes", 0),
                       host_source=note + host["how"] if host else "not measured",
                       kernels_source=note + entry["kernels_how"] if "kernels_how" in entry else source)
