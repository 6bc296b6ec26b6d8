"""graphc plan | explain | diff | check | run. Exit codes: 0 fits (plans equal; check passed; every request
served), 1 does not fit (plans differ; check failed; a request failed), 2 invalid input, 3 a plan device's
worker process died (graphc run)."""
from __future__ import annotations

import argparse
import os
import sys

from graphc.errors import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_INVALID, DoesNotFit, GraphcError, InvalidInput, Stopped
from graphc.units import parse_bytes


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors are invalid input too
        self.print_usage(sys.stderr)
        print(f"error: {message}\nFix: see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_INVALID)


MAX_DEVICES = 1024      # placement search grows with the device count: 1024 plan in seconds, 10**5 never end
DEFAULT_MAX_TOKENS = 4096   # graphc run: what a request naming no max_tokens may generate (issue 38: no 27k-token default)


def _bytes(text: str) -> int:
    try:
        n = parse_bytes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 80GiB, 512MiB, 85000000000)") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is a negative size; sizes are bytes, 0 or more")
    return n


def _counts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device count or a comma-separated list of them") from None
    if any(n < 1 for n in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{text!r}: device counts are positive and distinct")
    if max(out) > MAX_DEVICES:
        raise argparse.ArgumentTypeError(f"{text!r}: graphc plans at most {MAX_DEVICES} devices")
    return out


def build_parser() -> argparse.ArgumentParser:
    from graphc import __version__

    p = _Parser(prog="graphc", description="Compile a declared multimodal model into a checked serving plan.")
    p.add_argument("--version", action="version", version=f"graphc {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _add_plan(sub)
    _add_explain(sub)
    _add_check(sub)
    _add_run(sub)
    df = sub.add_parser("diff", help="what changed between two plans (exit 1 when they differ)")
    df.add_argument("a")
    df.add_argument("b")
    return p


def _add_plan(sub) -> None:
    """`graphc plan MODEL.py --gpu ...`: plan a model for one target, or sweep several."""
    pl = sub.add_parser("plan", help="plan a model for a target", description="Plan MODEL.py for a target GPU.")
    pl.add_argument("model", help="a model file defining declare(preset)")
    pl.add_argument("--gpu", required=True,
                    help="target: h100, h200, a100-80gb, a100-40gb, l40s, b200, b300, cpu; several, comma-separated, "
                         "plan each and print one table (a what-if sweep)")
    pl.add_argument("--gpus", type=_counts, default=[1], help="number of devices (default 1); several, comma-separated, "
                                                              "sweep them")
    pl.add_argument("--replicas", type=int, default=None, metavar="R",
                    help="with --gpus N: 1 (one copy over the N devices) or N (a replica on each, requests routed "
                         "between them); default: the compiler chooses and the plan says why")
    pl.add_argument("--tp", type=int, default=None, metavar="N",
                    help="with --gpus N: split one copy over N tensor-parallel ranks, one a GPU (the model file's "
                         "declare() takes tp); 1: never split; default: the compiler chooses and the plan says why")
    pl.add_argument("--preset", default=None, help="the model file's preset (default: its declare() default)")
    pl.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="declare the nodes from DIR/config.json (HF field names); the plan records it")
    pl.add_argument("-o", "--output", default=None, help="plan file to write (default: <model>.<gpu>x<N>.plan)")
    pl.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting, e.g. walks.prefill.budget.tokens=256 (repeatable)")
    pl.add_argument("--config", default=None, metavar="FILE.yaml", help="overrides from a YAML file (--set wins)")
    pl.add_argument("--fit", action="store_true", help="when over budget, apply trims until it fits and record them")
    pl.add_argument("--memory-cap", type=_bytes, default=None,
                    help="emulate a smaller card, e.g. 80GiB; for --gpu cpu, the host budget its devices split")
    pl.add_argument("--headroom", type=_bytes, default=None, help="bytes kept free per device (default 1%% of a GPU)")
    pl.add_argument("--no-remedies", action="store_true", help="refuse without re-planning remedies (faster)")
    pl.add_argument("--html", default=None, metavar="FILE", help="also write an HTML report")
    pl.add_argument("-q", "--quiet", action="store_true", help="print only the output path")


def _add_explain(sub) -> None:
    """`graphc explain PLAN`: where each ledger number came from."""
    ex = sub.add_parser("explain", help="where each ledger number came from, why each rung exists")
    ex.add_argument("plan")
    ex.add_argument("--device", type=int, default=None, help="only this device's ledger")


def _add_check(sub) -> None:
    """`graphc check PLAN`: boot it and compare planned with measured bytes."""
    ck = sub.add_parser("check", help="boot a plan, capture every graph, report planned vs measured bytes")
    ck.add_argument("plan")
    ck.add_argument("--device", type=int, action="append", default=None,
                    help="boot only this plan device (repeatable; a 2-GPU plan is checked device by device)")
    ck.add_argument("--checkpoint", default=None, help="safetensors folder (default: seeded random weights)")
    ck.add_argument("--seed", type=int, default=0)
    ck.add_argument("--emulate", action="store_true", help="cap this GPU to the plan's card (same arch)")
    ck.add_argument("--force", action="store_true", help="boot even if the model file or target differ")
    ck.add_argument("--no-prebuild", action="store_true",
                    help="compile FlashInfer kernels on first use, not all in parallel before the boot")
    ck.add_argument("--tolerance", type=float, default=0.02, help="allowed measured/planned excess (default 0.02)")
    ck.add_argument("--json", default=None, metavar="FILE", help="also write planned and measured bytes as JSON")
    ck.add_argument("-q", "--quiet", action="store_true", help="no boot progress on stderr")


def _add_realtime(rn) -> None:
    """graphc run's options of WS /v1/realtime (graphc/serve/realtime/route.py)."""
    rn.add_argument("--max-realtime-sessions", type=int, default=64, metavar="N",
                    help="the most WS /v1/realtime sessions open at once; another is closed with code 1013 "
                         "(default 64)")
    rn.add_argument("--realtime-idle-timeout", type=float, default=600.0, metavar="S",
                    help="a realtime session with no client event and nothing generating for S seconds is closed "
                         "(default 600)")


def _add_run(sub) -> None:
    """`graphc run PLAN`: serve it over HTTP, or run a JSONL batch offline."""
    rn = sub.add_parser("run", help="serve a plan: an OpenAI-compatible server, or a JSONL batch offline",
                        description="Boot PLAN and serve its request kinds.")
    rn.add_argument("plan")
    rn.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="weights, config.json, tokenizer.json and chat template")
    rn.add_argument("--random-weights", action="store_true",
                    help="seeded weights (benchmarks): token ids only, or text with --tokenizer")
    rn.add_argument("--seed", type=int, default=0, help="weights (with --random-weights) and unseeded sampling")
    rn.add_argument("--requests", default=None, metavar="IN.jsonl", help="run these requests offline and exit")
    rn.add_argument("--output", default=None, metavar="OUT.jsonl", help="where offline results go (default: stdout)")
    rn.add_argument("--audio-dir", default=None, metavar="DIR",
                    help="where spoken answers go as ID.wav (default: OUT.audio/ beside --output, else graphc-audio/)")
    rn.add_argument("--stats", default=None, metavar="FILE.json", help="offline: steps per walk and rung, timings")
    rn.add_argument("--host", default="127.0.0.1")
    rn.add_argument("--port", type=int, default=8000)
    rn.add_argument("--api-key", default=None, metavar="KEY",
                    help="every route but /health wants 'Authorization: Bearer KEY' (default: $GRAPHC_API_KEY; "
                         "unset: open)")
    rn.add_argument("--max-waiting", type=int, default=None, metavar="N",
                    help="the most requests waiting for the engine; more are refused with 429 and Retry-After "
                         "(default: 8 x the decode walk's sequences)")
    rn.add_argument("--gather-ms", type=float, default=None, metavar="MS",
                    help="an idle engine waits up to MS for requests still preparing beside the first (their "
                         "media preprocessed in parallel), so that one step takes them all (default: 50; 0: never)")
    rn.add_argument("--media-dir", default=None, metavar="DIR",
                    help="requests may name media files under DIR (default: none; requests send their bytes)")
    rn.add_argument("--media-urls", action="store_true",
                    help="fetch http(s) media URLs (at most 25 MiB each, 10 s, no redirect or address that is "
                         "private, loopback or link-local)")
    rn.add_argument("--access-log", action="store_true", help="one JSON line per HTTP request on stderr")
    rn.add_argument("--max-upload-mb", type=float, default=25.0, metavar="MB",
                    help="largest /v1/audio/transcriptions upload in MiB (default 25, as OpenAI's)")
    _add_engine(rn)
    _add_text(rn)
    rn.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                    help="the names the server answers to (requests may give any; responses carry the first; "
                         "default: the plan's model name)")
    _add_realtime(rn)
    rn.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                    help="on SIGINT or SIGTERM, the seconds requests in flight get to finish before each left ends "
                         "with an error event; then the server exits 0 (default 30)")
    rn.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                    help=f"the most a request that names no max_tokens generates (default {DEFAULT_MAX_TOKENS}; "
                         "never past what the plan's context leaves after the prompt)")
    rn.add_argument("--emulate", action="store_true", help="cap this GPU to the plan's card (same arch)")
    rn.add_argument("--force", action="store_true", help="boot even if the model file or target differ")
    rn.add_argument("--ray", default=None, metavar="ADDRESS",
                    help="run each plan device as an actor of this Ray cluster ('auto': the running one; 'local': "
                         "start one on this host); needs pip install 'graphc[ray]'")
    rn.add_argument("-q", "--quiet", action="store_true",
                    help="no boot progress on stderr (default: a line per boot phase, bars on a terminal)")


def _add_engine(rn) -> None:
    """graphc run's options of how the engine schedules its steps."""
    rn.add_argument("--no-prefix-cache", action="store_true",
                    help="compute every prompt row (default: full pages of text rows another request computed are "
                         "reused; never for plans with linear-attention state)")
    rn.add_argument("--audio-lead-ms", type=float, default=None, metavar="MS",
                    help="a speaking request's later audio chunks may wait, while the text or speech model has a "
                         "step to run, as long as its audio leads playback by more than MS, so the audio decoder's "
                         "steps carry more chunks (default: each chunk is decoded as soon as its frames exist)")
    rn.add_argument("--no-overlap", action="store_true",
                    help="read each LLM step's tokens back before building the next (default: the next step is "
                         "launched first, so host work runs while the GPU computes)")


def _add_text(rn) -> None:
    """graphc run's text options: where the tokenizer and chat template come from."""
    rn.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="tokenizer.json and chat template from DIR instead of the checkpoint's (with --checkpoint "
                         "or --random-weights); examples/tools/synthetic_tokenizer.py writes one for a plan")
    rn.add_argument("--chat-template", default=None, metavar="FILE|TEXT",
                    help="render chat requests with this template (a file, or the template's text when it holds a "
                         "'{') instead of the tokenizer folder's (--tokenizer, else the checkpoint)")
    rn.add_argument("--trust-request-chat-template", action="store_true",
                    help="let a chat request bring its own chat_template (rendered in the same sandbox); "
                         "without it such a request is refused")


def cmd_plan(args) -> int:
    from graphc.dynamo_stub import without_dynamo
    from graphc.overrides import load_config, merge, parse_set
    from graphc.pipeline import compile_model
    from graphc.source import load_model, read_config
    from graphc.report import plan_html, plan_summary, refusal

    overrides = merge(load_config(args.config) if args.config else {}, parse_set(args.sets))
    gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
    if len(set(gpus)) != len(gpus) or not gpus:
        raise InvalidInput(f"--gpu {args.gpu}: targets are named once each", "", "e.g. --gpu h100,h200")
    source = load_model(args.model, args.preset, read_config(args.checkpoint) if args.checkpoint else None)
    if len(gpus) * len(args.gpus) > 1:
        with without_dynamo():
            return _sweep(source, gpus, args.gpus, overrides, args)
    args.gpu, args.gpus = gpus[0], args.gpus[0]
    try:
        with without_dynamo():               # a plan compiles nothing (graphc/dynamo_stub.py)
            compiled = compile_model(source, args.gpu, args.gpus, overrides, fit=args.fit,
                                     memory_cap=args.memory_cap, headroom=args.headroom,
                                     remedies=not args.no_remedies, replicas=args.replicas,
                                     tp=args.tp)
    except DoesNotFit as e:
        print(refusal(source.model.name, e.result, e.remedies) if e.result is not None else f"error: {e}",
              file=sys.stderr, end="")
        return EXIT_DOES_NOT_FIT
    out = args.output or f"{source.model.name}.{args.gpu}x{args.gpus}.plan"
    _write(out, compiled.plan.to_yaml(), "-o")
    if args.html:
        _write(args.html, plan_html(compiled.plan), "--html")
    print(out if args.quiet else plan_summary(compiled.plan, out), end="" if not args.quiet else "\n")
    if not args.quiet:
        from graphc import memo

        traces, where = memo.table("simulate_steps.traces"), memo.cache_dir()
        print(f"simulated steps: {traces.hits} of {len(traces)} read from the cache in {where}" if where else
              "simulated steps: the disk cache is off (GRAPHC_CACHE_DIR=off)", file=sys.stderr)
    return EXIT_FITS


def _write(path: str, text: str, flag: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise InvalidInput(f"cannot write {flag} {path}", f"{type(e).__name__}: {e.strerror or e}",
                           f"pass a writable file path to {flag}") from None


def cheapest(rows: list[dict]) -> dict | None:
    """The row that fits with the least GPU memory in all, then the fewest devices (None: nothing fits)."""
    fitting = [r for r in rows if r["fits"]]
    return min(fitting, key=lambda r: (r["memory"], r["gpus"])) if fitting else None


def _sweep(source, gpus: list[str], counts: list[int], overrides: dict, args) -> int:
    """Plan every target and device count; one table: fits, KV tokens of each pool, the cheapest that fits
    (the least GPU memory in all, then the fewest devices). Writes no plan."""
    from tqdm import tqdm

    from graphc.pipeline import compile_model
    from graphc.targets import get_target
    from graphc.units import fmt_bytes

    if args.output or args.html:
        raise InvalidInput("a sweep (several --gpu or --gpus) writes no plan", "it compares targets",
                           "plan the target you choose alone to write its plan (-o, --html)")
    rows = []
    combos = [(g, n) for g in gpus for n in counts]
    for g, n in tqdm(combos, desc="planning", unit="target", file=sys.stderr, disable=args.quiet or None):
        target = get_target(g, args.memory_cap, n)
        row = {"gpu": g, "gpus": n, "memory": target.host_bytes or n * target.memory_bytes}
        try:
            c = compile_model(source, g, n, overrides, fit=args.fit, memory_cap=args.memory_cap,
                              headroom=args.headroom, remedies=False)
            model = c.result.sizing.ir.model
            row["fits"], row["kv"] = True, {r: sum(p.pages.values()) * model.resource(r).page_size
                                             for r, p in c.plan.resources.items() if p.pages}
            row["trimmed"], row["replicas"], row["tp"] = len(c.plan.trimmed), c.plan.replicas, c.plan.tensor_parallel
        except DoesNotFit as e:
            why = e.result.fit.problems[0].text if e.result is not None and e.result.fit.problems else e.what
            row["fits"], row["why"] = False, why.splitlines()[0]
        except InvalidInput as e:
            row["fits"], row["why"] = False, f"refused: {e.what}"
        rows.append(row)
    best = cheapest(rows)
    print(f"{source.model.name}: {len(rows)} targets planned")
    print(f"{'target':<12}{'gpus':>5}  {'GPU memory':>11}  {'fits':<5} KV tokens (per pool) or why not")
    for r in rows:
        mark = " <- cheapest" if r is best else ""
        if r["fits"]:
            kv = ", ".join(f"{k} {v:,}" for k, v in r["kv"].items()) or "no KV pools"
            kv += f" in each of {r['replicas']} replicas" if r["replicas"] > 1 else ""
            kv += f" (the tokens' heads split over {r['tp']} tensor-parallel ranks)" if r["tp"] > 1 else ""
            kv += f" ({r['trimmed']} trims)" if r["trimmed"] else ""
            print(f"{r['gpu']:<12}{r['gpus']:>5}  {fmt_bytes(r['memory']):>11}  {'yes':<5} {kv}{mark}")
        else:
            print(f"{r['gpu']:<12}{r['gpus']:>5}  {fmt_bytes(r['memory']):>11}  {'no':<5} {r['why']}")
    if best is None:
        print("nothing fits: plan one target alone to see its ranked remedies")
        return EXIT_DOES_NOT_FIT
    print(f"cheapest that fits: {best['gpu']} x {best['gpus']} (the least GPU memory in all, then the fewest devices)")
    return EXIT_FITS


def cmd_explain(args) -> int:
    from graphc.plan import load_plan
    from graphc.report import explain

    plan = load_plan(args.plan)
    if args.device is not None and not 0 <= args.device < len(plan.devices):
        raise InvalidInput(f"--device {args.device} is not in the plan", f"it has devices 0..{len(plan.devices) - 1}")
    print(explain(plan, args.device), end="")
    return EXIT_FITS


def cmd_check(args) -> int:
    from graphc.plan import load_plan
    from graphc.report import render
    from graphc.runtime.boot import boot_plan
    from graphc.runtime.check import compare
    from graphc.runtime.progress import shown

    plan = load_plan(args.plan)
    ranks = None
    with shown(args.quiet):                  # the boot's phases on stderr (graphc/runtime/progress.py)
        if plan.tensor_parallel > 1:         # every rank boots at once (their steps sum over the ranks)
            from graphc.runtime.tensor_parallel import Ranks

            opts = dict(checkpoint=args.checkpoint, seed=args.seed, emulate=args.emulate, force=args.force,
                        prebuild=not args.no_prebuild)
            ranks = Ranks(plan, lambda: boot_plan(plan, rank=0, **opts)[0], opts)
            boots = [ranks.booted]
        else:
            boots = boot_plan(plan, args.device, args.checkpoint, args.seed, args.emulate, args.force,
                              prebuild=not args.no_prebuild)
    checks = [compare(b, args.tolerance) for b in boots]
    print(render("check.txt.j2", plan=plan, checks=checks, tolerance=args.tolerance), end="")
    others = {}
    if ranks is not None:
        from graphc.runtime.engine import Engine

        others = ranks.checks
        print("".join(Engine.ledger_line(r, c, "rank") + "\n" for r, c in others.items()), end="")
        ranks.close()
    if args.json:
        import dataclasses
        import json

        with open(args.json, "w") as f:
            json.dump({"plan": args.plan, "checks": [dataclasses.asdict(c) for c in checks],
                       "measured": [b.measured for b in boots]}, f, indent=1)
    return EXIT_FITS if all(c.ok for c in checks) and all(c["ok"] for c in others.values()) else EXIT_DOES_NOT_FIT


def cmd_run(args) -> int:
    import os

    from graphc.hostmem import check_host_memory
    from graphc.plan import check_servable, load_plan
    plan = load_plan(args.plan)
    check_servable(plan, f"plan {args.plan}")         # before torch is imported or a byte is loaded
    if not args.ray:                                   # Ray places devices on hosts of its own
        check_host_memory(plan, f"plan {args.plan}")
    from graphc.runtime.engine import read_jsonl
    if args.checkpoint and args.random_weights:
        raise InvalidInput("--checkpoint and --random-weights are exclusive", "", "pass one")
    if not 0 < args.max_upload_mb < float("inf"):
        raise InvalidInput(f"--max-upload-mb {args.max_upload_mb} is not a size", "", "pass a positive number")
    names = args.served_model_name or []
    if any(not n.strip() for n in names) or len(set(names)) != len(names):
        raise InvalidInput(f"--served-model-name {' '.join(map(repr, names))}", "each name must be non-empty and given once",
                           "e.g. --served-model-name my-model org/my-model")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise InvalidInput(f"--shutdown-timeout {args.shutdown_timeout} is not a time", "", "pass seconds, 0 or more")
    if args.max_realtime_sessions < 0 or not 0 < args.realtime_idle_timeout < float("inf"):
        raise InvalidInput(f"--max-realtime-sessions {args.max_realtime_sessions} --realtime-idle-timeout "
                           f"{args.realtime_idle_timeout}", "sessions are 0 or more (0: none), the timeout seconds "
                           "over 0", "pass e.g. --max-realtime-sessions 64 --realtime-idle-timeout 600")
    from graphc.serve.driver import gather_window
    gather_window(args.gather_ms)                      # refused before the boot
    if args.max_waiting is not None and args.max_waiting < 1:
        raise InvalidInput(f"--max-waiting {args.max_waiting}", "at least one request must be able to wait",
                           "pass 1 or more")
    if args.media_dir is not None and not os.path.isdir(args.media_dir):
        raise InvalidInput(f"--media-dir {args.media_dir} is not a folder", "", "name an existing folder")
    requests = read_jsonl(args.requests) if args.requests else None
    if args.ray and plan.tensor_parallel > 1:
        raise InvalidInput(f"--ray serves plans of one copy on whole devices; plan {args.plan} splits its nodes over "
                           f"{plan.tensor_parallel} tensor-parallel ranks", "its ranks run as processes of one host",
                           "run it without --ray, or plan it again with --tp 1")
    if args.ray and plan.replicas > 1:
        raise InvalidInput(f"--ray serves plans of one copy; plan {args.plan} has {plan.replicas} replicas",
                           "replicas run as engines of one process on one host",
                           "run it without --ray, or plan it again with --replicas 1")
    from graphc.runtime.progress import shown
    with shown(args.quiet):                            # the boot's phases on stderr (graphc/runtime/progress.py)
        return _run_on_ray(plan, args, requests) if args.ray else _boot_and_run(plan, args, requests)


def _boot_and_run(plan, args, requests: list | None) -> int:
    """graphc run on this host: an Engine (or one per replica), then the server or the offline batch."""
    from graphc.runtime.engine import Engine

    serving = Engine
    if plan.replicas > 1:                              # an engine per replica, requests routed between them
        from graphc.runtime.replicas import Replicas as serving
    engine = serving(plan, args.checkpoint, random_weights=args.random_weights, seed=args.seed,
                     emulate=args.emulate, force=args.force, prefix_cache=not args.no_prefix_cache,
                     overlap=not args.no_overlap, default_max_tokens=args.default_max_tokens,
                     audio_lead_ms=args.audio_lead_ms,
                     chat_template=args.chat_template, tokenizer=args.tokenizer)
    try:
        return _serve_or_run(engine, args, requests)
    finally:
        engine.close()                 # a multi-device plan's worker processes


def _server_options(args) -> dict:
    import os

    return {"api_key": args.api_key or os.environ.get("GRAPHC_API_KEY") or None, "access_log": args.access_log,
            "max_audio_bytes": int(args.max_upload_mb * 1024 * 1024), "max_waiting": args.max_waiting,
            "gather_ms": args.gather_ms,
            "media_dir": args.media_dir, "media_urls": args.media_urls, "shutdown_timeout": args.shutdown_timeout,
            "served_model_name": args.served_model_name,
            "trust_request_chat_template": args.trust_request_chat_template,
            "max_realtime_sessions": args.max_realtime_sessions, "realtime_idle_timeout": args.realtime_idle_timeout}


def _serving_on(host: str, args, api_key, where: str = "") -> None:
    print(f"serving on http://{host}:{args.port}/v1{where}{' (API key required)' if api_key else ''}", file=sys.stderr)


def _serve_or_run(engine, args, requests: list | None) -> int:
    print(engine.summary(), file=sys.stderr)
    if requests is None:
        from graphc.serve import serve

        opts = _server_options(args)
        _serving_on(args.host, args, opts["api_key"])
        serve(engine, args.host, args.port, **opts)
        return EXIT_FITS
    from graphc.runtime.batch import run_batch
    from graphc.runtime.engine import parse_or_refuse

    limits = engine.media_limits()
    return _write_offline(*run_batch(engine, [parse_or_refuse(item, i, limits) for i, item in enumerate(requests)]),
                          args)


def _run_on_ray(plan, args, requests: list | None) -> int:
    """graphc run --ray: the plan's devices as actors of a Ray cluster (graphc/runtime/ray_run.py); the
    requests are read and their media loaded here, the results written here."""
    from graphc.runtime.engine import llm_node, parse_or_refuse
    from graphc.runtime.ray_run import RayServing

    llm = llm_node(plan)
    serving = RayServing(plan, args.ray, llm_device=next(d.index for d in plan.devices if llm in d.nodes),
                         checkpoint=args.checkpoint, random_weights=args.random_weights, seed=args.seed,
                         emulate=args.emulate, force=args.force, prefix_cache=not args.no_prefix_cache,
                         overlap=not args.no_overlap, default_max_tokens=args.default_max_tokens,
                         audio_lead_ms=args.audio_lead_ms,
                         chat_template=args.chat_template, tokenizer=args.tokenizer, quiet=args.quiet)
    try:
        print(serving.summary + f" (Ray cluster {args.ray})", file=sys.stderr)
        if requests is None:
            opts = _server_options(args)
            _serving_on(args.host, args, opts["api_key"], f" on the engine actor's node, {serving.node_ip()}")
            serving.serve(args.host, args.port, **opts)
            return EXIT_FITS
        limits = serving.media_limits()
        outs, stats, line = serving.generate([parse_or_refuse(item, i, limits) for i, item in enumerate(requests)])
        return _write_offline(outs, stats, line, args)
    finally:
        serving.close()


def _write_offline(outs, stats: dict, line: str, args) -> int:
    """Offline results: spoken answers as WAV files, one JSON line a request, the stats."""
    import json

    spoken = [o for o in outs if o.audio is not None]
    if spoken:                          # each spoken answer as a WAV file, named by its request id
        from pathlib import Path

        import soundfile as sf

        where = Path(args.audio_dir or (Path(args.output).with_suffix(".audio") if args.output else "graphc-audio"))
        where.mkdir(parents=True, exist_ok=True)
        for o in spoken:
            path = where / f"{o.id}.wav"
            sf.write(path, o.audio, o.sample_rate, subtype="PCM_16")
            o.audio_path = str(path)
    lines = "".join(json.dumps(o.to_dict()) + "\n" for o in outs)
    if args.output:
        with open(args.output, "w") as f:
            f.write(lines)
    else:
        sys.stdout.write(lines)
    print(line, file=sys.stderr)
    for o in outs:
        if o.error is not None:
            print(f"request {o.id}: {o.finish_reason}: {o.error.splitlines()[0]}", file=sys.stderr)
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump(stats, f, indent=1)
    return EXIT_FITS if all(o.error is None for o in outs) else EXIT_DOES_NOT_FIT


def cmd_diff(args) -> int:
    from graphc.plan import load_plan
    from graphc.plandiff import diff_plans

    changes = diff_plans(load_plan(args.a), load_plan(args.b))
    print("\n".join(changes) if changes else "plans are equivalent")
    return 1 if changes else 0


EXIT_BROKEN_PIPE = 141      # 128 + SIGPIPE, as a shell reports a writer whose reader closed
EXIT_INTERRUPTED = 130      # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:          # --help, or a malformed command line (exit 2)
        return int(e.code or 0)
    try:
        code = {"plan": cmd_plan, "explain": cmd_explain, "diff": cmd_diff, "check": cmd_check,
                "run": cmd_run}[args.cmd](args)
        sys.stdout.flush()                   # a closed reader shows here, not at the interpreter's exit
        return code
    except GraphcError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Stopped as e:
        # a second SIGINT or SIGTERM stopped graphc run's server at once; it said so in one line
        return 128 + e.signum
    except KeyboardInterrupt:
        # Ctrl-C: the command's own cleanup (finally blocks: a server, worker processes) has run; say so, no traceback
        print("graphc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`graphc diff A B | head -2`): stop quietly with the shell's code for a
        # process that SIGPIPE ended, and point stdout at /dev/null so that its flush at exit cannot raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


# commands that hold nothing at their end that the interpreter's teardown would release (no device, server,
# child process or open file): the console script leaves after them without it
QUICK_EXIT = ("plan", "explain", "diff")


def entry() -> None:
    """The `graphc` console script: main(), then sys.exit; after the planner's commands os._exit once the output
    is flushed instead, skipping the teardown of what torch and the built modules left (0.4-0.6 s of a cold
    `graphc plan`, `python -c "import torch"` alone 1.44 against 0.97-1.11 s)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):      # a reader gone, or a stream closed: nothing left to write to
            pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
