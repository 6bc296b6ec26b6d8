"""Human reports rendered from templates/: the plan summary, refusals, explain and diff."""
from __future__ import annotations

from functools import lru_cache

import jinja2

from graphc.memo import cache_dir
from graphc.units import fmt_bytes


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """The templates compiled once into the disk memo's directory (jinja2 checks each against its source's
    checksum and writes each whole, by rename): compiling explain's template took up to 0.1 s of each
    `graphc explain`. A disk that takes no file leaves the report uncached, as the memo does."""

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """None where the cache is off or its directory cannot be made."""
    where = cache_dir()
    if where is None:
        return None
    try:
        (where / "templates").mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _TemplateCache(str(where / "templates"))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("graphc", "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True,
                             bytecode_cache=_bytecode_cache())
    env.globals["b"] = fmt_bytes
    return env


def render(template: str, **context) -> str:
    return _env().get_template(template).render(**context)


def plan_summary(plan, out: str | None = None) -> str:
    return render("plan.txt.j2", plan=plan, out=out)


def plan_html(plan) -> str:
    return render("plan.html.j2", plan=plan)


def explain(plan, device: int | None = None) -> str:
    return render("explain.txt.j2", plan=plan, device=device)


def refusal(model_name: str, result, remedies: list) -> str:
    t = result.sizing.ir.target
    return render("refusal.txt.j2", name=model_name, count=result.sizing.ir.num_devices, gpu=t.name,
                  capacity=t.memory_bytes, problems=result.fit.problems, devices=result.placement.devices,
                  remedies=remedies)
