"""`graphc plan MODEL --gpu A,B --gpus 1,2`: one row per target and device count, each equal to that target
planned alone (fits, KV tokens of each pool: pages x page size from the plan written alone), or the
reason it does not fit; a plan of replicas says its pools are each replica's; the cheapest that fits by the stated rule (least GPU memory in all, then fewest
devices), computed here; a sweep writes no plan (issue 14)."""
import pytest

from graphc.cli import cheapest, main
from graphc.plan import load_plan
from graphc.targets import get_target

MODEL = "models/tiny_omni.py"


def rows(text: str) -> dict[tuple[str, int], str]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1].isdigit() and parts[0] in ("h100", "l40s", "a100-40gb"):
            out[(parts[0], int(parts[1]))] = line
    return out


def test_each_row_is_its_target_planned_alone(tmp_path, capsys):
    assert main(["plan", MODEL, "--gpu", "h100,l40s,a100-40gb", "--gpus", "1,2", "-q"]) == 0
    got = rows(capsys.readouterr().out)
    assert set(got) == {(g, n) for g in ("h100", "l40s", "a100-40gb") for n in (1, 2)}
    memory = {}
    for (g, n), line in got.items():
        path = tmp_path / f"{g}{n}.plan"
        assert main(["plan", MODEL, "--gpu", g, "--gpus", str(n), "-o", str(path), "-q"]) == 0
        capsys.readouterr()
        plan = load_plan(path)
        pools = {r: sum(p.pages.values()) * 16 for r, p in plan.resources.items() if p.pages}   # page size 16
        assert " yes " in line and all(f"{r} {t:,}" in line for r, t in pools.items()), line
        assert (f"in each of {plan.replicas} replicas" in line) == (plan.replicas > 1), line
        memory[(g, n)] = n * get_target(g).memory_bytes
    best = min(memory, key=lambda k: (memory[k], k[1]))
    assert best == ("a100-40gb", 1)                              # 39.39 GiB: the smallest card, once
    assert got[best].endswith("<- cheapest") and sum(x.endswith("<- cheapest") for x in got.values()) == 1


def test_a_target_that_does_not_fit_says_why(capsys):
    assert main(["plan", MODEL, "--gpu", "h100,l40s", "--gpus", "1", "--memory-cap", "850MiB", "-q"]) == 1
    out = capsys.readouterr().out
    assert all(" no " in line for line in rows(out).values()) and "nothing fits" in out


@pytest.mark.parametrize("argv", [["--gpu", "h100,l40s", "-o", "x.plan"], ["--gpu", "h100", "--gpus", "1,2", "--html", "x.html"],
                                  ["--gpu", "h100,h100"], ["--gpu", "h100", "--gpus", "1,1"], ["--gpu", "h100", "--gpus", "1,x"]])
def test_a_sweep_is_refused_what_it_cannot_do(argv, capsys):
    assert main(["plan", MODEL, *argv, "-q"]) == 2
    assert "error:" in capsys.readouterr().err


def test_cheapest_is_the_least_memory_then_the_fewest_devices():
    r = lambda g, n, mem, fits=True: {"gpu": g, "gpus": n, "memory": mem, "fits": fits}  # noqa: E731
    h200, l40s2, a100, l40s_big = r("h200", 1, 140), r("l40s", 2, 89), r("a100", 1, 79, fits=False), r("x", 3, 89)
    assert cheapest([h200, l40s2, a100, l40s_big]) is l40s2        # more devices, less memory in all; 89 twice: 2 < 3
    assert cheapest([a100]) is None
