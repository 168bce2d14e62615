"""The `metrale` command: flags, exit codes, and choosing the target. No measuring here.

Exit codes: 0 done (verdict passed or none), 1 verdict failed, 2 usage error, 3 run failed.
A user's mistake is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from metrale import __version__
from metrale.errors import EXIT_USAGE, MetraleError, RunError, UsageError

T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem and where help is."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0..65535)")
    return value


def _out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; accepted: a directory path")
    return Path(text)


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument(
        "--target",
        metavar="URL",
        help="OpenAI-compatible base URL (default: start the embedded SmolLM2 model)",
    )
    g.add_argument("--model", help="model name (default: the first one the target serves)")
    g.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    g.add_argument(
        "--retries",
        type=_non_negative_int,
        default=2,
        help="retries per call on connection errors, 429 and 5xx (default 2)",
    )
    g.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=600.0,
        metavar="S",
        help="seconds per request, server-side queueing included (default 600)",
    )
    g.add_argument("--no-stream", action="store_true", help="non-streaming calls")  # fmt: skip
    g.add_argument(
        "--max-response-kb",
        type=_non_negative_int,
        default=None,
        metavar="KB",
        help="largest response body kept per call; beyond it the call fails as "
        "response_too_large (default: 16 KiB + 4 KiB per max_tokens token, 0 = no cap)",
    )


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    """Flags that choose and shape a runtime (where commands run); see `runtime_from_args`."""
    g = p.add_argument_group("runtime")
    g.add_argument("--runtime", metavar="NAME", help="subprocess, bwrap, docker or ray")
    g.add_argument(
        "--retries-runtime",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="retries of a sandbox start that failed (default 0)",
    )
    g.add_argument(
        "--runtime-rate",
        type=_positive_float,
        metavar="PER_S",
        help="at most this many sandbox starts per second",
    )
    g.add_argument("--image", help="docker: image (default metrale/base:bookworm)")
    g.add_argument("--docker-cli", metavar="CLI", help="docker: CLI to use (docker, podman)")
    g.add_argument("--ray-address", metavar="ADDR", help="ray: auto, HOST:PORT or local")
    g.add_argument(
        "--ray-inner", metavar="NAME", help="ray: sandbox per actor, subprocess or bwrap"
    )
    g.add_argument(
        "--cpu-seconds",
        type=_non_negative_int,
        metavar="S",
        help="CPU seconds per process (RLIMIT_CPU)",
    )
    g.add_argument(
        "--memory-mb",
        type=_non_negative_int,
        metavar="MB",
        help="bwrap: the sandbox's total memory where a memory cgroup can be made, else per "
        "process (default 8192); subprocess: address space per process; docker: container memory",
    )
    g.add_argument(
        "--tmp-mb",
        type=_positive_int_arg,
        metavar="MB",
        help="bwrap: size of the sandbox's /tmp tmpfs (default 512)",
    )
    g.add_argument(
        "--env",
        action="append",
        metavar="NAME[=VALUE]",
        help="pass a variable into every sandbox (NAME alone: its value in metrale's "
        "environment); nothing else of metrale's environment reaches a sandbox (repeatable)",
    )
    g.add_argument(
        "--max-procs",
        type=_non_negative_int,
        metavar="N",
        help="processes of the sandbox user (docker: pids limit)",
    )
    g.add_argument(
        "--file-size-mb",
        type=_non_negative_int,
        metavar="MB",
        help="largest file a process may write",
    )
    g.add_argument(
        "--bind",
        action="append",
        metavar="SRC[:DST]",
        help="bwrap: writable bind of a host path (repeatable)",
    )
    g.add_argument(
        "--ro-bind",
        action="append",
        metavar="SRC[:DST]",
        help="bwrap: read-only bind of a host path (repeatable)",
    )
    g.add_argument(
        "--network",
        action="store_true",
        help="let sandboxes reach the network (bwrap: host network; docker: bridge)",
    )
    g.add_argument(
        "--output-cap",
        type=_non_negative_int,
        metavar="BYTES",
        help="stdout/stderr kept per command, head and tail (default 1 MiB)",
    )


def _positive_int_arg(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _env_args(items: list[str] | None) -> dict[str, str] | None:
    """`--env NAME` (value from metrale's environment) and `--env NAME=VALUE`, in order."""
    if not items:
        return None
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name or "\0" in item:
            raise UsageError(f"--env {item!r}: expected NAME or NAME=VALUE")
        if not sep:
            if name not in os.environ:
                raise UsageError(
                    f"--env {name}: {name} is not set in metrale's environment; "
                    f"set it or pass --env {name}=VALUE"
                )
            value = os.environ[name]
        env[name] = value
    return env


def runtime_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The RuntimeConfig the runtime flags describe, or None without `--runtime`."""
    from metrale.runtime import runtime_config

    name = getattr(args, "runtime", None)
    options = {
        "image": getattr(args, "image", None),
        "cli": getattr(args, "docker_cli", None),
        "address": getattr(args, "ray_address", None),
        "inner": getattr(args, "ray_inner", None),
        "cpu_s": getattr(args, "cpu_seconds", None),
        "memory_mb": getattr(args, "memory_mb", None),
        "max_procs": getattr(args, "max_procs", None),
        "file_size_mb": getattr(args, "file_size_mb", None),
        "rw_binds": getattr(args, "bind", None),
        "ro_binds": getattr(args, "ro_bind", None),
        "output_cap_bytes": getattr(args, "output_cap", None),
        "start_rate": getattr(args, "runtime_rate", None),
        "tmp_mb": getattr(args, "tmp_mb", None),
        "env": _env_args(getattr(args, "env", None)),
    }
    if getattr(args, "network", False):
        options["network"] = "bridge" if name == "docker" else True
    if not name:
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise UsageError(f"runtime option(s) {', '.join(given)} need --runtime NAME")
        return None
    return runtime_config(name, **options)


def build_parser() -> _Parser:
    parser = _Parser(prog="metrale", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"metrale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser(
        "run",
        # Benchmark parameters arrive as unknown flags: no abbreviation may swallow one
        # (serve's --api would otherwise be taken for --api-key).
        allow_abbrev=False,
        help="run one benchmark against a target",
        description="Run a benchmark. Benchmark parameters are flags too: "
        "--rollouts 8, or -p rollouts=8 (see 'metrale list').",
    )
    run.add_argument(
        "benchmark", nargs="?", help="benchmark id (see 'metrale list'); none with --resume"
    )
    run.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a benchmark parameter (repeatable)",
    )
    add_target_args(run)
    add_runtime_args(run)
    run.add_argument(
        "--out",
        type=_out_dir,
        metavar="DIR",
        help="run directory (default runs/<UTC timestamp>-<benchmark>); one that holds an "
        "earlier run is refused unless --overwrite",
    )
    run.add_argument(
        "--overwrite", action="store_true", help="replace the earlier run held in --out"
    )
    run.add_argument(
        "--resume",
        type=_out_dir,
        metavar="RUN_DIR",
        help="finish an earlier run: run only its missing rollouts, with its run.json settings",
    )
    run.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: run the failed rollouts again too (their old records move to "
        "retried.jsonl)",
    )
    run.add_argument(
        "--budgets",
        type=Path,
        metavar="FILE",
        help="budgets file (default ./BENCH.toml when it exists)",
    )
    run.add_argument("--json", action="store_true", help="print the final result as JSON")
    run.add_argument("--no-preflight", action="store_true", help="skip the 2+2 sanity check")
    run.add_argument("-q", "--quiet", action="store_true", help="no live progress")
    run.set_defaults(handler=cmd_run)

    lst = sub.add_parser("list", help="list benchmarks with their parameters")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(handler=cmd_list)

    sim = sub.add_parser("sim", help="serve the deterministic simulator endpoint")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=_port, default=8000, help="0 picks a free port")
    sim.add_argument("--model", default="metrale-sim")
    sim.add_argument("--ttft", type=float, default=0.0, metavar="S", help="time to first token")
    sim.add_argument("--itl", type=float, default=0.0, metavar="S", help="inter-token delay")
    sim.add_argument("--output-tokens", type=_non_negative_int, default=16)
    sim.add_argument("--reply", default=None, help="fixed reply text (split on spaces)")
    sim.add_argument("--error-rate", type=float, default=0.0, help="fraction of calls to fail")
    sim.add_argument(
        "--error-kinds", default="5xx,drop,malformed", help="comma list of 5xx, drop, malformed"
    )
    sim.add_argument("--no-usage", action="store_true", help="send no usage in responses")
    sim.add_argument(
        "--header-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="hold the response headers back S after the request (send, headers and first "
        "token then differ)",
    )
    sim.add_argument(
        "--require-api-key",
        metavar="KEY",
        help="answer 401 unless a request carries 'Authorization: Bearer KEY'",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--max-running",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="capacity: at most N requests served at once, the rest queue (0 = no cap)",
    )
    sim.add_argument(
        "--token-budget",
        type=float,
        default=0.0,
        metavar="TOK_S",
        help="capacity: output tokens/s shared by all streams (0 = no budget)",
    )
    sim.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="serve recorded assistant turns from a JSONL file (see metrale.endpoint.replay)",
    )
    sim.set_defaults(handler=cmd_sim)  # fmt: skip
    add_matrix_commands(sub)
    add_runtime_commands(sub)
    return parser


# --------------------------------------------------------------------------- helpers


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """asyncio.run with SIGTERM treated like Ctrl-C, so every `finally` and `async with` unwinds."""

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await make()

    return asyncio.run(main())


def parse_bench_args(extra: Sequence[str], pairs: Sequence[str]) -> dict[str, str]:
    """`--rollouts 8`, `--max-concurrent=4`, `--no-flag` and `-p key=value` into a raw dict."""
    raw: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE, got {pair!r}")
        raw[key.strip().replace("-", "_")] = value
    tokens = list(extra)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise UsageError(f"unexpected argument {tok!r}; benchmark parameters are --name VALUE")
        name, sep, value = tok[2:].partition("=")
        name = name.replace("-", "_")
        if not sep:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or nxt.startswith("--"):
                if name.startswith("no_"):
                    name, value = name[3:], "false"
                else:
                    value = "true"
            else:
                value = nxt
                i += 1
        # A repeated flag accumulates, comma-joined: --slo ttft_ms=200 --slo tpot_ms=50.
        raw[name] = f"{raw[name]},{value}" if name in raw else value
        i += 1
    return raw


def resolve_api_key(flag: str | None) -> str | None:
    return flag if flag is not None else os.environ.get("OPENAI_API_KEY")


@contextlib.asynccontextmanager
async def open_target(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Yield a probed `Target`: the user's, or the embedded llama.cpp server started for us."""
    from metrale.endpoint.client import Target
    from metrale.endpoint.probe import probe

    api_key = resolve_api_key(args.api_key)
    if args.target:
        found = await probe(args.target, args.model, api_key)
        yield Target(base_url=found.base_url, model=found.model, api_key=api_key)
        return
    from metrale.endpoint.local import LocalLlamaServer, embedded_model_path

    embedded_model_path()  # a missing extra is a usage error, before anything starts
    print("starting the embedded llama.cpp server (SmolLM2-135M-Instruct)...", file=sys.stderr)
    server = LocalLlamaServer()
    async with server as server_url:
        found = await probe(server_url, args.model, None)
        yield Target(base_url=found.base_url, model=found.model, embedded=True)
    if server.died:
        raise RunError(f"the embedded llama.cpp server died during the run ({server.died})")


def client_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from metrale.endpoint.client import ClientOptions

    return ClientOptions(
        request_timeout_s=args.request_timeout,
        retries=args.retries,
        stream=not args.no_stream,
        max_response_bytes=None if args.max_response_kb is None else args.max_response_kb * 1024,
    )


# --------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale import runner
    from metrale.budgets import load_budgets
    from metrale.table import render

    if args.resume is not None and args.benchmark is not None:
        extra = _reclaim_positional(args, extra)
    raw: dict[str, object] = dict(parse_bench_args(extra, args.param))
    runtime = runtime_from_args(args)
    options = client_options(args)
    if args.retry_errors and args.resume is None:
        raise UsageError("--retry-errors needs --resume RUN_DIR")
    if args.resume is not None:
        from metrale.resume import resumed_run

        if args.overwrite:
            raise UsageError("--overwrite conflicts with --resume")
        defaults = client_options(build_parser().parse_known_args(["run", "x"])[0])
        earlier = resumed_run(args.resume, args, raw, runtime, options, defaults)  # type: ignore[arg-type]
        args.benchmark, args.target, args.model = earlier.benchmark, earlier.target, earlier.model
        raw, runtime, options, budgets = (
            earlier.params,
            earlier.runtime,
            earlier.client,
            earlier.budgets,
        )
    else:
        if not args.benchmark:
            raise UsageError("metrale run needs a benchmark id (see 'metrale list') or --resume")
        budgets_path = args.budgets
        if budgets_path is None and Path("BENCH.toml").is_file():
            budgets_path = Path("BENCH.toml")
        budgets = load_budgets(budgets_path, args.benchmark) if budgets_path else {}
    if runtime is not None:
        from metrale.runtime import check_runtime

        check_runtime(runtime)

    async def go() -> runner.RunResult:
        from metrale.endpoint.client import Target

        request = runner.RunRequest(
            benchmark=args.benchmark,
            params=raw,
            target=Target(base_url="", model=""),
            client_options=options,
            out=args.resume if args.resume is not None else args.out,
            resume=args.resume is not None,
            retry_errors=args.retry_errors,
            overwrite=args.overwrite,
            budgets=budgets,
            preflight=not args.no_preflight,
            runtime=runtime,
            runtime_retries=args.retries_runtime,
            progress=None if args.quiet else sys.stderr,
        )
        runner.prepare(request)  # bad parameters fail before a server starts
        runner.check_run_dir(request)  # so does a run directory that must not be written
        async with open_target(args) as target:
            request.target = target
            return await runner.run(request)

    outcome = run_async(go)
    result = outcome.result
    out = sys.stderr if args.json else sys.stdout
    if result.table.columns:
        print(render(result.table.columns, result.table.rows), file=out)
    for line in result.verdict.lines():
        print(line, file=out)
    if result.error:
        print(f"run failed: {result.error}", file=sys.stderr)
    print(f"run directory: {outcome.run_dir}", file=sys.stderr)
    if args.json:
        print(outcome.model_dump_json(indent=2))
    return outcome.exit_code


def _reclaim_positional(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """`run --resume DIR --rollouts 9`: argparse takes `9` for the (optional) benchmark id.
    A value that names no benchmark goes back after the first parameter flag left without
    one."""
    from metrale.plugin import discover

    tokens = list(extra)
    if args.benchmark in discover():
        return tokens
    for i, tok in enumerate(tokens):
        bare = tok.startswith("--") and "=" not in tok
        if bare and (i + 1 == len(tokens) or tokens[i + 1].startswith("--")):
            tokens.insert(i + 1, args.benchmark)
            args.benchmark = None
            break
    return tokens


def cmd_list(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.plugin import discover

    _no_extra(extra)
    found = discover()
    if args.json:
        out: list[dict[str, Any]] = []
        for cls in found.values():
            bench = cls()
            out.append({
                **cls.descriptor.model_dump(),
                "parameters": [s.model_dump() for s in bench.parameters()],
            })  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    for bench_id, cls in found.items():
        d = cls.descriptor
        print(f"{bench_id}: {d.name}. {d.summary}")
        for spec in cls().parameters():
            default = "none" if spec.default is None else repr(spec.default)
            print(f"  --{spec.name.replace('_', '-'):<18} {spec.describe_type():<28} "
                  f"default {default}  {spec.help}")  # fmt: skip
        print()
    return 0


def cmd_sim(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.endpoint.sim import ERROR_KINDS, SimConfig, serve_forever

    _no_extra(extra)
    kinds = tuple(k.strip() for k in args.error_kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in ERROR_KINDS]
    if bad or not kinds:
        raise UsageError(f"unknown --error-kinds {bad}; accepted: {', '.join(ERROR_KINDS)}")
    if not 0 <= args.error_rate <= 1:
        raise UsageError(f"--error-rate {args.error_rate} is outside 0..1")
    if args.ttft < 0 or args.itl < 0 or args.header_delay < 0:
        raise UsageError("--ttft, --itl and --header-delay must be >= 0 seconds")
    if args.token_budget < 0:
        raise UsageError(f"--token-budget {args.token_budget} must be >= 0 tokens/s")
    config = SimConfig(
        host=args.host, port=args.port, model=args.model, ttft_s=args.ttft, itl_s=args.itl,
        output_tokens=args.output_tokens, reply=args.reply, error_rate=args.error_rate,
        error_kinds=kinds, usage=not args.no_usage, seed=args.seed,
        max_running=args.max_running or None, token_budget=args.token_budget or None,
        header_delay_s=args.header_delay, api_key=args.require_api_key,
    )  # fmt: skip
    if args.replay is not None:
        from metrale.endpoint.replay import load_replay

        config.replay = load_replay(args.replay)
    try:
        run_async(lambda: serve_forever(config))
    except asyncio.CancelledError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0


# --------------------------------------------------------------------------- matrix


def add_matrix_commands(sub: Any) -> None:
    """`matrix`, `report`, `plot`, `compare`: sweeps and what is read from their cell files."""
    mx = sub.add_parser(
        "matrix",
        help="sweep a benchmark over runtimes, rollout counts, caps and tiers",
        description="Run one cell per point of the sweep, each through the runner, and write "
        "<out>/<cell>.json per cell. Lists are comma-separated; a flag overrides the file.",
    )
    mx.add_argument("benchmark", nargs="?", help="benchmark id (or benchmark = in --config)")
    mx.add_argument("--config", type=Path, metavar="FILE", help="sweep file (TOML)")
    mx.add_argument("--runtime", metavar="LIST", help="runtimes, e.g. none,subprocess,bwrap")
    mx.add_argument("--rollouts", metavar="LIST", help="rollout counts, e.g. 64,512")
    mx.add_argument(
        "--max-concurrent", metavar="LIST", help="caps, none = unbounded, e.g. none,128"
    )
    mx.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=V1[,V2]",
        help="a benchmark parameter; a comma list sweeps it (repeatable)",
    )
    mx.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="NAME=URL[,model=M]",
        help="a named deployment to sweep side by side (repeatable)",
    )
    add_target_args(mx)
    mx.add_argument("--out", type=_out_dir, metavar="DIR", help="default results/<benchmark>")
    mx.add_argument(
        "--resume", action="store_true", help="skip cells whose file says they completed"
    )
    mx.add_argument("--only", metavar="GLOBS", help="run only cells whose name matches")
    mx.add_argument("--no-preflight", action="store_true", help="skip the 2+2 sanity check")
    mx.add_argument(
        "--retries-runtime",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="retries of a sandbox start that failed (default 0)",
    )
    mx.add_argument("-q", "--quiet", action="store_true", help="no live progress of each cell")
    mx.set_defaults(handler=cmd_matrix)

    rep = sub.add_parser("report", help="the table of a sweep or a run, one row per cell")
    rep.add_argument(
        "dir", type=Path, metavar="DIR", help="a 'metrale matrix' directory or a run directory"
    )
    fmt = rep.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="numbers as CSV (durations in seconds)")
    fmt.add_argument("--json", action="store_true", help="numbers as JSON (durations in seconds)")
    rep.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained page")
    rep.set_defaults(handler=cmd_report)

    plo = sub.add_parser("plot", help="plot a sweep or a serve run directory to a PNG")
    plo.add_argument(
        "dir", type=Path, metavar="DIR", help="a 'metrale matrix' or serve run directory"
    )
    plo.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.{png,svg,pdf}")
    plo.set_defaults(handler=cmd_plot)

    cmp_ = sub.add_parser(
        "compare",
        help="B vs A per metric and stage, with bootstrap 95%% intervals and a verdict",
        description="A and B: two cell files, two sweep directories (cells matched by name) "
        "or two run directories. Exit 1 when any row is worse.",
    )
    cmp_.add_argument("a", type=Path, metavar="A")
    cmp_.add_argument("b", type=Path, metavar="B")
    cmp_.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        metavar="FRACTION",
        help="differences below this fraction of A are 'same' (default 0.05)",
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="compare only these declared metrics (repeatable; default: all)",
    )
    cmp_.add_argument("--csv", action="store_true", help="CSV instead of a plain table")
    cmp_.set_defaults(handler=cmd_compare)


def cmd_matrix(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.errors import EXIT_RUN_FAILED
    from metrale.matrix import plan_sweep, run_sweep
    from metrale.matrix.sweep import build_sweep, select, split_list

    _no_extra(extra)
    sweep = build_sweep(
        benchmark=args.benchmark, config=args.config, runtime=args.runtime,
        rollouts=args.rollouts, max_concurrent=args.max_concurrent, params=args.param,
        tiers=args.tier, target=args.target, model=args.model, out=args.out,
    )  # fmt: skip
    plan = plan_sweep(sweep)
    cells = select(plan.cells, split_list(args.only) if args.only else [])

    async def go() -> list[Any]:
        async with contextlib.AsyncExitStack() as stack:
            targets = {}
            for tier in dict.fromkeys(c.tier for c in cells):
                tier_args = argparse.Namespace(
                    **{**vars(args), "target": tier.target, "model": tier.model}
                )
                targets[tier.name] = await stack.enter_async_context(open_target(tier_args))
            return await run_sweep(
                plan,
                targets,
                client_options=client_options(args),
                preflight=not args.no_preflight,
                cells=cells,
                runtime_retries=args.retries_runtime,
                resume=args.resume,
                progress=None if args.quiet else sys.stderr,
            )

    results = run_async(go)
    failed = sum(1 for r in results if r.status == "failed")
    print(f"{len(results)} cells ({failed} failed) in {sweep.out}", file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0


def cmd_report(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.matrix import cell_from_run_dir, is_run_dir, read_cells
    from metrale.matrix.report import failure_notes, render_report

    _no_extra(extra)
    # a run directory is one row; a sweep directory a row per cell file
    cells = [cell_from_run_dir(args.dir)] if is_run_dir(args.dir) else read_cells(args.dir)
    if args.html is not None:
        from metrale.matrix.html import write_html

        print(f"wrote {write_html(args.dir, cells, args.html)}", file=sys.stderr)
    print(render_report(cells, "csv" if args.csv else "json" if args.json else "markdown"))
    if args.csv or args.json:
        for note in failure_notes(cells):
            print(note, file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Dispatch on what DIR holds: a sweep directory (cell files from `metrale matrix`), or the
    run directory of a benchmark that draws its own figure (`plugin.PlotsRuns`, e.g. serve's
    latency against throughput)."""
    from metrale.matrix import is_cell_dir
    from metrale.matrix.plot import figure_format
    from metrale.plugin import PlotsRuns, get_benchmark
    from metrale.rundir import run_benchmark_id

    _no_extra(extra)
    figure_format(args.output)  # the format, from the extension, before any work
    bench_id = run_benchmark_id(args.dir)  # a run directory has a run.json; a sweep has none
    if bench_id is not None:
        bench = get_benchmark(bench_id)
        if not isinstance(bench, PlotsRuns):
            raise UsageError(
                f"{args.dir}: a {bench_id} run has no figure of its own; "
                "plot a 'metrale matrix' directory instead"
            )
        print(f"wrote {bench.plot_run(args.dir, args.output)}", file=sys.stderr)
        return 0
    if is_cell_dir(args.dir):
        from metrale.matrix.plot import plot_dir

        info = plot_dir(args.dir, args.output)
        print(f"wrote {info.path} ({info.width_px}x{info.height_px} px)", file=sys.stderr)
        return 0
    raise UsageError(
        f"{args.dir}: nothing to plot; accepted: a 'metrale matrix' directory "
        "or a run directory of a benchmark that draws one (serve)"
    )


def cmd_compare(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.errors import EXIT_VERDICT_FAILED
    from metrale.matrix.compare import compare_paths, render_comparison

    _no_extra(extra)
    if not 0 <= args.tolerance < 1:
        raise UsageError(f"--tolerance {args.tolerance} is outside 0..1")
    names = [n.strip() for item in args.metric for n in item.split(",") if n.strip()]
    result = compare_paths(args.a, args.b, rel_tol=args.tolerance, names=names)
    print(render_comparison(result, "csv" if args.csv else "plain"))
    return EXIT_VERDICT_FAILED if result.worse else 0


def add_runtime_commands(sub: Any) -> None:
    ex = sub.add_parser(
        "exec",
        help="run one command in a fresh sandbox",
        description="Start a fresh sandbox, run COMMAND in it, print its output, stop the "
        "sandbox; exit with the command's exit code (124 on timeout).",
    )
    add_runtime_args(ex)
    ex.add_argument("--timeout", type=_positive_float, metavar="S", help="seconds (default none)")
    ex.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    ex.set_defaults(handler=cmd_exec)
    cl = sub.add_parser(
        "cleanup",
        help="remove what killed runs left: labelled containers, bwrap workdirs and cgroups",
        description="Remove the sandboxes of runs that are no longer alive: docker containers "
        "with the metrale.sandbox label, bwrap workdirs and pids cgroups. What a live run uses "
        "is kept. Exit 0, also when there is nothing to remove.",
    )
    cl.add_argument("--docker-cli", metavar="CLI", default="docker")
    cl.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="also remove containers of live runs and of other hosts",
    )
    cl.set_defaults(handler=cmd_cleanup)


def cmd_exec(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.runtime import check_runtime, create_runtime

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    _no_extra(extra)
    if not args.runtime:
        raise UsageError("metrale exec needs --runtime NAME (subprocess, bwrap, docker, ray)")
    if not command:
        raise UsageError("metrale exec needs a command after --")
    config = runtime_from_args(args)
    check_runtime(config)

    async def go() -> int:
        from metrale.runtime import RuntimeStartError

        try:
            async with create_runtime(config) as sandbox:
                result = await sandbox.run(command, timeout=args.timeout)
        except RuntimeStartError as exc:
            raise RunError(f"sandbox did not start: {exc}") from None
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        sys.stderr.flush()
        return 124 if result.timed_out else result.exit_code

    try:
        return run_async(go)
    except FileNotFoundError as exc:
        raise RunError(f"cannot start the sandbox: {exc}") from None
    except RuntimeError as exc:
        raise RunError(f"sandbox failed: {exc}") from None


def cmd_cleanup(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.runtime.cleanup import cleanup

    _no_extra(extra)
    for line in cleanup(args.docker_cli, everything=args.everything).lines():
        print(line)
    return 0


def _no_extra(extra: Sequence[str]) -> None:
    if extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.handler(args, extra))
    except MetraleError as exc:
        print(f"metrale: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("metrale: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `metrale report DIR | head`: the reader left; say nothing more, as `cat` would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
