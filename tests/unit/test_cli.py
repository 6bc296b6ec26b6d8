"""The CLI's exit codes and files, run in-process (and, for a reader that goes away, in a process of its own)."""
import pytest
import yaml

from graphc.cli import main
from graphc.errors import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_INVALID
from tests.conftest import TINY


def test_version_prints_the_packages(capsys):
    from importlib.metadata import PackageNotFoundError, version

    from graphc import __version__
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"graphc {__version__}"
    try:                                   # an installed graphc reports the same version as its metadata
        assert version("graphc") == __version__
    except PackageNotFoundError:
        pass


def test_plan_writes_a_plan_and_exits_0(tmp_path, capsys):
    out, html = tmp_path / "t.plan", tmp_path / "t.html"
    assert main(["plan", TINY, "--gpu", "h100", "-o", str(out), "--html", str(html)]) == EXIT_FITS
    assert "FITS" in capsys.readouterr().out
    assert "capture_pool" in html.read_text() and "<table>" in html.read_text()
    data = yaml.safe_load(out.read_text())
    assert data["format"] == "graphc.plan/1" and data["target"]["gpu"] == "h100"


def test_explain_and_diff(tmp_path, capsys):
    a, b = tmp_path / "a.plan", tmp_path / "b.plan"
    assert main(["plan", TINY, "--gpu", "h100", "-o", str(a), "-q"]) == EXIT_FITS
    assert main(["plan", TINY, "--gpu", "h100", "-o", str(b), "-q", "--set", "walks.decode.budget.seqs=8"]) == EXIT_FITS
    capsys.readouterr()
    assert main(["explain", str(a)]) == 0
    text = capsys.readouterr().out
    assert "calibrated: CUDA context" in text and "why each rung exists" in text and "capture order" in text
    assert main(["diff", str(a), str(a)]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == 1
    assert "node decoder walk decode: budget 16 -> 8" in capsys.readouterr().out


def test_does_not_fit_exits_1_with_remedies(tmp_path, capsys):
    rc = main(["plan", TINY, "--gpu", "h100", "-o", str(tmp_path / "x.plan"),
               "--set", "resources.decoder_kv.pages=10"])
    err = capsys.readouterr().err
    assert rc == EXIT_DOES_NOT_FIT and "does NOT fit" in err and "resources.decoder_kv.pages=64" in err
    assert not (tmp_path / "x.plan").exists()


def test_invalid_input_exits_2(tmp_path, capsys):
    assert main(["plan", TINY, "--gpu", "h10"]) == EXIT_INVALID
    assert "use --gpu h100" in capsys.readouterr().err
    assert main(["plan", TINY, "--gpu", "h100", "--set", "walks.decode.budgt.seqs=2"]) == EXIT_INVALID
    assert "use 'budget'" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "none.py"), "--gpu", "h100"]) == EXIT_INVALID
    assert main(["plan", TINY, "--gpu", "h100", "--preset", "huge"]) == EXIT_INVALID
    assert "unknown preset 'huge'" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("walks: [1, 2]\n")
    assert main(["plan", TINY, "--gpu", "h100", "--config", str(cfg)]) == EXIT_INVALID
    assert main(["plan", TINY, "--gpu", "h100", "--memory-cap", "lots"]) == EXIT_INVALID


def test_config_file_and_set_combine(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("walks:\n  decode:\n    budget: {seqs: 8}\n  prefill:\n    budget: {tokens: 64}\n")
    out = tmp_path / "p.plan"
    assert main(["plan", TINY, "--gpu", "cpu", "--config", str(cfg), "--set", "walks.decode.budget.seqs=4",
                 "-o", str(out), "-q"]) == EXIT_FITS
    plan = yaml.safe_load(out.read_text())
    assert plan["walks"]["decode"]["budget"] == {"seqs": 4} and plan["walks"]["prefill"]["budget"]["tokens"] == 64


def test_explain_lists_each_nodes_kernel_choices_apart(capsys):
    """The shipped H200 plan's `kernels` line: each node's knobs as name=value, separated (they once ran
    together: fused_max_tokens=16384fused_norms=1)."""
    assert main(["explain", "plans/qwen3_omni_h200.plan"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kernels:"))
    plan = yaml.safe_load(open("plans/qwen3_omni_h200.plan"))
    for name, node in plan["nodes"].items():
        if node.get("kernels"):
            assert f"{name} " + " ".join(f"{k}={v}" for k, v in node["kernels"].items()) in line, line


@pytest.mark.parametrize("cmd", [["diff", "plans/qwen3_omni_h200.plan", "plans/omni_2gpu.plan"],
                                 ["explain", "plans/tiny_cpu.plan"]])
def test_a_reader_that_goes_away_ends_it_quietly(cmd):
    """`graphc diff A B | head -2`: a reader that closes before the output is written ends the command with
    the shell's code for SIGPIPE (141) and nothing on stderr, not a BrokenPipeError traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-m", "graphc.cli", *cmd], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                      # gone before the command (half a second of imports) writes a byte
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == "", err


@pytest.mark.parametrize("cmd, code", [(["diff", "plans/tiny_cpu.plan", "plans/tiny_h100.plan"], 1),
                                       (["explain", "plans/tiny_cpu.plan"], 0),
                                       (["plan", "no_such_model.py", "--gpu", "h100"], 2)])
def test_the_console_script_leaves_with_every_byte_and_the_code(cmd, code, capsys):
    """The console script (cli.entry) skips the interpreter's teardown after plan, explain and diff: what main()
    writes reaches a pipe whole (block-buffered, so an exit without a flush would drop it) with main()'s code."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "graphc.cli", *cmd], cwd=root, capture_output=True, text=True)
    assert main(cmd) == code == done.returncode
    here = capsys.readouterr()
    assert (done.stdout, done.stderr) == (here.out, here.err) and (here.out or here.err)


def test_ctrl_c_ends_graphc_run_with_130_and_no_traceback(tmp_path):
    """Ctrl-C while `graphc run` works through a batch: the engine's cleanup runs, it says it was interrupted
    and exits with the shell's code for SIGINT (130), without a KeyboardInterrupt traceback."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"prompt_token_ids": [1, 2, 3], "max_tokens": 200, "ignore_eos": True})
                            + "\n" for _ in range(400)))
    # SIGINT as a terminal delivers it: a test run from a background shell would hand the child SIGINT ignored
    p = subprocess.Popen([sys.executable, "-m", "graphc.cli", "run", "plans/tiny_cpu.plan", "--random-weights",
                          "--requests", str(reqs)], cwd=root, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = b""
    while b"requests:" not in seen and p.poll() is None:         # the batch has started (its progress bar)
        seen += p.stderr.read1(4096)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    err = (seen + p.stderr.read()).decode()
    assert p.wait(timeout=60) == 130, err
    assert "graphc: interrupted" in err and "Traceback" not in err, err


def test_explain_says_whether_graphc_run_caches_prefixes(capsys):
    """Qwen3.5's plan holds linear-attention state: no prefix caching, and why; Qwen3-Omni's caches."""
    assert main(["explain", "plans/qwen3_5_9b_h200.plan"]) == 0
    assert "prefix caching: off" in capsys.readouterr().out
    assert main(["explain", "plans/qwen3_omni_h200.plan"]) == 0
    assert "prefix caching: on unless `graphc run --no-prefix-cache`" in capsys.readouterr().out
