"""`streamlab bench`: measure the transports, the relay, silent readers and
cancellation on a running lab.

Every bench exits 0 when its checks held, 1 when one did not (or it crashed),
2 on a usage error or a lab without a capability it needs, 3 when the lab is
unreachable (commands/exits.py). Three benches measure against targets rather
than judge a run: `relay` (performance targets), `scale` (a sweep meant to
cross its cadence target) and `setup` (CPU per stream set-up): they show a
missed target and exit 0.

A list option takes its items either way: repeated (`--sweep 10 --sweep 50`)
or comma-separated (`--sweep 10,50`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streamlab.commands.conventions import OutputConsole, fail, plot_extra, split_list
from streamlab.commands.exits import (
    EXIT_CODES,
    EXIT_CODES_TARGETS,
    experiment_exits,
    reach,
    verdict_exit,
)
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir
from streamlab.experiments import render
from streamlab.experiments.bench.transports import BENCH_TIMING, run_transports, transport_names
from streamlab.experiments.report import Report

app = typer.Typer(help=__doc__, no_args_is_help=True,
                  short_help="Measure transports, relay, silent readers, cancellation.")
console = OutputConsole()
err = OutputConsole(stderr=True)


def _list_option(values: list[str] | None, default: str) -> list[str]:
    """A list option's items (repeated, comma-separated or both), else `default`'s."""
    return split_list(values, default.split(","))


def _ints(option: str, values: list[str] | None, default: str) -> list[int]:
    items = _list_option(values, default)
    try:
        return [int(item) for item in items]
    except ValueError:
        raise typer.BadParameter(f"{option} {','.join(items)!r}: whole numbers") from None


# A list option: repeated or comma-separated; None is the default its help names.
ListOption = list[str] | None


def _progress() -> Progress:
    # On stderr, so `--json > file` stays clean.
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True)


def _render(report: Report, *, as_json: bool = False, as_markdown: bool = False,
            plot: Path | None = None, verdict: bool = True) -> None:
    """Every bench ends here: its plot written when asked (listed among the report's
    artifacts), then the report printed as JSON, Markdown or tables, then the
    exit status of its verdict (0 every check held, 1 not); a bench whose
    checks are targets to read, not a verdict (`verdict=False`), exits 0."""
    if plot is not None:
        from streamlab.experiments.bench import plot as plots  # matplotlib: late

        report = plots.plot(report, plot)
        for artifact in report.artifacts:
            err.print(f"plot written to {artifact.path}", markup=False)
    render.show(report, console, as_json=as_json, as_markdown=as_markdown)
    if verdict:
        verdict_exit(report)


@app.command(epilog=EXIT_CODES,
             short_help="Polling, long polling, SSE, WebSocket, gRPC: same model.")
def transports(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    repetitions: Annotated[int, typer.Option("--repeat", "--reps", "-n", min=1,
                                             help="Runs per transport.")] = 5,
    intervals: Annotated[ListOption, typer.Option(
        help="Short-polling intervals, ms (default: 50,250,1000).")] = None,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens per answer.")] = 50,
    gap_ms: Annotated[int, typer.Option(min=1, help="Model's gap between tokens.")] = 50,
    gzip: Annotated[bool, typer.Option(help="Let HTTP clients accept gzip (nginx "
                                            "compresses streams and JSON).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table.")
                           ] = False,
    plot: Annotated[Path | None, typer.Option(
        callback=plot_extra, help="Write the timeline and costs PNG here.")] = None,
) -> None:
    """Polling (several intervals), long polling, SSE, WebSocket and direct gRPC, same model."""
    lab = reach(run_dir)
    intervals_ms = _ints("--intervals", intervals, "50,250,1000")
    names = transport_names(intervals_ms)
    timing = replace(BENCH_TIMING, gap_ms=gap_ms, tokens=tokens)
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("warming up", total=len(names) * (repetitions + 1))

        def on_run(name: str, rep: int) -> None:
            label = name if rep < 0 else f"{name} · run {rep + 1}/{repetitions}"
            progress.update(task, description=label)
            progress.advance(task)

        report = run_transports(lab, timing, repetitions, intervals_ms, gzip, on_run)
    _render(report, as_json=as_json, as_markdown=as_markdown, plot=plot)


@app.command(epilog=EXIT_CODES_TARGETS,
             short_help="What each hop of the relay costs, against floor and naive.")
def relay(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    concurrency: Annotated[ListOption, typer.Option(
        help="Concurrency levels (default: 1,64).")] = None,
    streams_c1: Annotated[int, typer.Option(min=1, help="Streams at concurrency 1.")] = 10,
    tokens: Annotated[int, typer.Option(min=2, help="Tokens per stream.")] = 20,
    gap_ms: Annotated[int, typer.Option(min=1, help="Model's gap between tokens.")] = 50,
    load_streams: Annotated[int, typer.Option(help="Streams in the inter-chunk load cell "
                                                   "(0 skips it).")] = 100,
    load_gap_ms: Annotated[int, typer.Option(min=1, help="Gap in the load cell.")] = 20,
    load_tokens: Annotated[int, typer.Option(min=2, help="Tokens per load stream.")] = 100,
    only: Annotated[ListOption, typer.Option(
        "--paths", help="Only these paths (grpc, grpc via hop, gateway, via nginx, full "
                        "chain, floor, naive; default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print Markdown tables.")
                           ] = False,
) -> None:
    """gRPC vs gateway vs nginx vs the full chain, against a bare floor and the naive relay."""
    from streamlab.experiments.bench.relay import bench_relay

    lab = reach(run_dir)
    levels = _ints("--concurrency", concurrency, "1,64")
    timing = replace(BENCH_TIMING, gap_ms=gap_ms, tokens=tokens)
    wanted = set(split_list(only))
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("starting", total=None)

        def on_cell(label: str) -> None:
            progress.update(task, description=label)
            progress.advance(task)

        report = bench_relay(lab, run_dir / "logs", timing, levels, streams_c1,
                             (load_streams, load_gap_ms, load_tokens) if load_streams else None,
                             wanted, lambda steps: progress.update(task, total=steps), on_cell)
    # Performance targets, shown beside the figures: a missed one is a finding.
    _render(report, as_json=as_json, as_markdown=as_markdown, verdict=False)


@app.command("slow-readers", epilog=EXIT_CODES,
             short_help="Clients that never read: gateway memory, wasted tokens.")
def slow_readers(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    clients: Annotated[int, typer.Option(min=1, help="Silent readers at once (mind the "
                                                     "gateway's per-client cap).")] = 50,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens each answer asks for (the "
                                                    "engine's limit is 16384 by default).")
                      ] = 4000,
    timeout_s: Annotated[float, typer.Option(min=1, help="Give up on a relay after this "
                                                         "long.")] = 240.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(
        callback=plot_extra, help="Write the RSS and tokens PNG here.")
                    ] = None,
) -> None:
    """N clients that never read: gateway memory and wasted tokens, direct vs detached relay."""
    from streamlab.experiments.bench.slow_readers import ReadersRefused, ReadersRun, compare

    lab = reach(run_dir)
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("starting", total=None)

        def on_sample(run: ReadersRun) -> None:
            progress.update(task, description=f"{run.relay}: {run.tokens_generated} tokens, "
                            f"+{run.peak_rss_mb - run.base_rss_mb:.0f} MiB")

        try:
            report = compare(lab, clients, tokens, timeout_s, on_sample)
        except ReadersRefused as exc:
            fail(str(exc))
    _render(report, as_json=as_json, plot=plot)


@app.command(epilog=EXIT_CODES, short_help="Abandoned streams: how fast the engine cancels.")
def cancel(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    streams: Annotated[int, typer.Option(help="Abandoned streams to open.")] = 200,
    concurrency: Annotated[int, typer.Option(help="Streams open at once.")] = 20,
    gap_ms: Annotated[int, typer.Option(help="Fake model gap between tokens.")] = 20,
    location: Annotated[str, typer.Option(help="nginx location to go through.")] = "/",
    background: Annotated[int, typer.Option(min=0, help=(
        "Other streams running meanwhile through the edge (a token a second; the "
        "caps are raised for them and put back after)."))] = 0,
    wire: Annotated[str, typer.Option(help=(
        "The gateways' engine wire: lab (as it runs), per_request, multiplexed, or "
        "both (each in turn, the gateways restarted on it)."))] = "lab",
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Open streams through the edge, leave each after 1-8 tokens, and report how
    fast the engine saw each cancel (p50/p99) and how many tokens it wasted.
    Exits 1 unless every stream was cancelled and none is left running (and,
    with --background, every background stream completed)."""
    from streamlab.experiments.bench.cancel import WIRES, bench_cancel, bench_cancel_wires

    if wire not in ("lab", "both", *WIRES):
        raise typer.BadParameter(f"--wire {wire!r}: lab, both, {', '.join(WIRES)}")

    lab = reach(run_dir)
    with experiment_exits(), _progress() as progress:
        task = progress.add_task(
            f"abandoning streams{f' beside {background} running' if background else ''}",
            total=streams)
        if wire == "lab":
            report = bench_cancel(lab, location=location, streams=streams,
                                  concurrency=concurrency, gap_ms=gap_ms, background=background,
                                  progress=lambda: progress.advance(task))
        else:
            wires = WIRES if wire == "both" else (wire,)
            progress.update(task, total=streams * len(wires))
            report = bench_cancel_wires(lab, wires, location=location, streams=streams,
                                        concurrency=concurrency, gap_ms=gap_ms,
                                        background=background,
                                        progress=lambda: progress.advance(task))
    _render(report, as_json=as_json)


@app.command(epilog=EXIT_CODES,
             short_help="The hf backend on its device: throughput, TTFT, cancels.")
def gpu(
    model: Annotated[str, typer.Option(help="A model directory (save_pretrained); "
                                            "default: random weights of --size.")] = "",
    size: Annotated[str, typer.Option(help="The random model: tiny or gpt2-small.")] = "tiny",
    device: Annotated[str, typer.Option(help="auto, cuda, cuda:1, cpu.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16, float32.")] = "auto",
    batches: Annotated[ListOption, typer.Option(
        help="Batch sizes (default: 1,8,32).")] = None,
    max_tokens: Annotated[int, typer.Option(min=2, help="Tokens per generation.")] = 64,
    cancel_after: Annotated[int, typer.Option(min=1, help="Tokens before a cancel.")] = 4,
    cpu_threads: Annotated[int, typer.Option(min=0, help="torch CPU threads (0: all).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """The hf backend on its device (no lab needed): tokens/s, TTFT, step time,
    cancel latency, tokens after a cancel and device memory at each batch size.
    Exits 1 if a cancel let more than one token through or memory did not come back."""
    from typing import cast

    from streamlab.experiments.bench.gpu import DType, GpuBenchOptions, run_gpu_bench

    dtypes = {"auto", "bfloat16", "float16", "float32"}
    if dtype not in dtypes:
        raise typer.BadParameter(f"--dtype {dtype!r}: one of {', '.join(sorted(dtypes))}")
    options = GpuBenchOptions(
        model=model or None, size=size, device=device, dtype=cast(DType, dtype),
        batches=tuple(_ints("--batches", batches, "1,8,32")), max_tokens=max_tokens,
        cancel_after=cancel_after, cpu_threads=cpu_threads)
    report = asyncio.run(run_gpu_bench(options))
    for failure in report.failures:
        err.print(f"FAIL {failure.description} (measured {failure.measured})")
    _render(report, as_json=as_json)


@app.command(epilog=EXIT_CODES_TARGETS,
             short_help="N paced streams: cadence, TTFT, CPU per token as N grows.")
def scale(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    sweep: Annotated[ListOption, typer.Option(
        help="Stream counts to try (default: 10,50,100,200,400); stops after every clock "
             "broke cadence.")] = None,
    tokens: Annotated[int, typer.Option(min=2, help="Tokens per stream.")] = 100,
    step_ms: Annotated[int, typer.Option(min=1, help="The engine's step (each stream's gap).")
                       ] = 20,
    clocks: Annotated[ListOption, typer.Option(
        help="Engine clocks to compare (default: batched,per_stream).")] = None,
    entry: Annotated[str, typer.Option(help="Where streams enter: edge (the full chain), "
                                            "nginx or gateway.")] = "edge",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(
        callback=plot_extra, help="Write the cadence and CPU PNG here (a directory: "
                                   "scale.png inside it; cell c: scale-slow.png beside it).")
    ] = None,
    slow_streams: Annotated[int, typer.Option(min=0, help="Cell c: slow streams at once "
                                                          "(1 token/s, heartbeat every 5 s); "
                                                          "0 skips the cell.")] = 5000,
    slow_tokens: Annotated[int, typer.Option(min=2, help="Cell c: tokens per slow stream "
                                                         "(one a second).")] = 20,
    slow_ramp_s: Annotated[float, typer.Option(min=0.0, help="Cell c: seconds over which "
                                                             "the slow streams open.")] = 10.0,
    admission: Annotated[ListOption, typer.Option(
        help="Cell c: the gateway's set-up admission, each in turn: off, on (default: "
             "off,on).")] = None,
    admission_rate: Annotated[float, typer.Option(min=0.1, help="Cell c: set-ups a second "
                                                                "with admission on.")
                              ] = 200.0,
    storm_streams: Annotated[int, typer.Option(min=0, help="Cell e: resumable streams cut "
                                                           "at once at the edge (a private "
                                                           "lab); 0 skips it.")] = 2000,
    cancel_background: Annotated[int, typer.Option(min=0, help="Cell f: streams running "
                                                               "while others are cancelled, "
                                                               "both wires; 0 skips it.")
                                 ] = 1000,
    cancel_streams: Annotated[int, typer.Option(min=1, help="Cell f: streams abandoned on "
                                                            "each wire.")] = 200,
    tracing: Annotated[ListOption, typer.Option(
        help="Cell g: tracing modes side by side, each in turn per round: off, on, or a "
             "sampling ratio such as 0.1 (a lab up with --tracing; default: none, the "
             "cell skipped).")] = None,
    tracing_rounds: Annotated[int, typer.Option(min=1, help="Cell g: rounds of every "
                                                            "mode.")] = 2,
    tracing_streams: Annotated[int, typer.Option(min=10, help="Cell g: two-token set-ups "
                                                              "per mode and round.")] = 500,
    tracing_baseline: Annotated[str | None, typer.Option(
        help="Cell g: also a mode `before`: the gateways and engines of this git revision "
             "of the clone (e.g. the commit before tracing), tracing off.")] = None,
    skip_cadence: Annotated[bool, typer.Option(help="Run only cell c (and d).")] = False,
    setup_streams: Annotated[int, typer.Option(min=0, help="Cell d: two-token streams at "
                                                           "100/s for CPU per stream set-up "
                                                           "(as `bench setup`); 0 skips it.")
                             ] = 1000,
) -> None:
    """N paced streams through the full chain: inter-chunk p50/p99 and TTFT p99 as N grows,
    the engine's batched clock vs per-stream timers, and µs of CPU per token per process;
    then (cell c) thousands of slow streams at once: all complete, gateway RSS per stream,
    heartbeat lateness, open files per process, without and with set-up admission. First
    (cell d) the CPU each process spends per stream set-up, as `bench setup` measures it;
    then (cell e) a reconnect storm and (cell f) cancel latency beside 1,000 streams, and
    (cell g, --tracing off,on,0.1) what tracing costs per set-up and per paced token.
    Last, every target of the cells that ran, measured / target / met, in one table."""
    from streamlab.experiments.bench.scale import ENTRIES, ScaleCell, bench_scale
    from streamlab.experiments.bench.tracing_cost import check_mode
    from streamlab.experiments.scenarios.reconnect_storm import fixed_storm

    lab = reach(run_dir)
    if entry not in ENTRIES:
        raise typer.BadParameter(f"entry must be edge, nginx or gateway, not {entry!r}")
    modes = tuple(_list_option(admission, "off,on"))
    if any(m not in ("off", "on") for m in modes):
        raise typer.BadParameter(f"--admission {','.join(modes)!r}: off, on, or off,on")
    traced = tuple(split_list(tracing))
    try:
        traced = tuple(check_mode(m) for m in traced)
    except ValueError as exc:
        raise typer.BadParameter(f"--tracing: {exc}") from None

    def on_cell(cell: ScaleCell) -> None:
        icl = cell.load.icl_ms
        err.print(f"{cell.clock:>10} · {cell.streams:>4} streams: inter-chunk p50 "
                  f"{icl.get('p50')} p99 {icl.get('p99')} ms, {cell.load.completed}/"
                  f"{cell.streams} complete, load {cell.loadavg[0]:.1f}")

    with experiment_exits():
        report = bench_scale(
            lab, sweep=tuple(_ints("--sweep", sweep, "10,50,100,200,400")), tokens=tokens,
            step_ms=step_ms, clocks=tuple(_list_option(clocks, "batched,per_stream")),
            entry=entry, slow_streams=slow_streams, slow_tokens=slow_tokens,
            slow_ramp_s=slow_ramp_s, admission=modes, admission_rate=admission_rate,
            cadence=not skip_cadence, setup_streams=setup_streams,
            storm_streams=storm_streams, cancel_background=cancel_background,
            cancel_streams=cancel_streams, floor_logs=run_dir / "logs", tracing=traced,
            tracing_rounds=tracing_rounds, tracing_streams=tracing_streams,
            tracing_baseline=tracing_baseline,
            storm_cell=fixed_storm,
            on_cell=on_cell, on_step=lambda step: err.print(f"{step} ..."))
    # The sweep is meant to cross the cadence target: a failed cell is the figure.
    _render(report, as_json=as_json, plot=plot, verdict=False)


@app.command(epilog=EXIT_CODES,
             short_help="Raw-socket load: TTFT, inter-chunk percentiles, its own CPU.")
def load(
    url: Annotated[str, typer.Argument(help="Where to send the streams (the edge by default).")
                   ] = "",
    run_dir: RunDir = DEFAULT_RUN_DIR,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", "--streams", min=1, help="Streams at once (fixed concurrency).")
    ] = 100,
    rate: Annotated[float, typer.Option(help="Open loop instead: Poisson arrivals per "
                                             "second.")] = 0.0,
    duration_s: Annotated[float, typer.Option(help="How long arrivals go on (with --rate).")
                          ] = 10.0,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens per stream.")] = 100,
    gap_ms: Annotated[int, typer.Option(min=0, help="The model's gap between tokens.")] = 20,
    heartbeat_s: Annotated[float, typer.Option(help="Heartbeat per stream (0: none).")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Raw-socket load through a lab: TTFT and inter-chunk percentiles, and the
    load generator's own CPU per token (so you can see it was not the limit)."""
    from streamlab.experiments.bench.load import bench_load

    target = url or f"{reach(run_dir).edge_url}/v1/chat/completions"
    with experiment_exits():
        report = bench_load(target, streams=concurrency, rate=rate, duration_s=duration_s,
                            tokens=tokens, gap_ms=gap_ms, heartbeat_s=heartbeat_s)
    _render(report, as_json=as_json)


@app.command(epilog=EXIT_CODES_TARGETS,
             short_help="CPU per stream set-up and per paced token, per process.")
def setup(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    streams: Annotated[int, typer.Option(min=1, help="Two-token streams in the set-up cell.")
                       ] = 1000,
    rate: Annotated[float, typer.Option(min=0.1, help="Set-up streams opened per second "
                                                      "(evenly spaced).")] = 100.0,
    paced: Annotated[str, typer.Option(help="Paced cell: streams,tokens,step_ms (mind the "
                                            "per-client cap); 'none' skips it.")
                     ] = "60,200,20",
    idle_s: Annotated[float, typer.Option(min=0.5, help="Idle baseline, seconds.")] = 3.0,
    quick: Annotated[bool, typer.Option(help="Small and fast: 100 streams at 50/s, paced "
                                             "10 x 50 (a smoke run, not a figure).")] = False,
    floor: Annotated[bool, typer.Option(help="Also the gRPC floor: the same set-ups between "
                                             "a bare grpc.aio server and client.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """CPU each process (gateway, engine, Toxiproxy, edge proxy, the client) spends per
    stream set-up (N two-token streams) and per paced token, idle taken off, against
    the set-up targets (gateway <= 1.0 ms, engine <= 0.3 ms per stream); beside them,
    the gRPC floor: what bare grpc.aio processes spend on the same set-ups."""
    from streamlab.experiments.bench.setup_cost import QUICK_PACED, QUICK_RATE, QUICK_STREAMS
    from streamlab.experiments.bench.setup_cost import bench_setup as run

    shape: tuple[int, int, int] | None = None
    if paced.strip().lower() != "none":
        try:
            count, tokens, step_ms = (int(x) for x in paced.split(","))
        except ValueError:
            raise typer.BadParameter(f"--paced {paced!r}: streams,tokens,step_ms or none"
                                     ) from None
        shape = (count, tokens, step_ms)
    if quick:
        streams, rate, shape = QUICK_STREAMS, QUICK_RATE, QUICK_PACED if shape else None
        idle_s = min(idle_s, 1.0)
    lab = reach(run_dir)
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("starting", total=None)
        report = run(lab, streams=streams, rate=rate, paced=shape, idle_s=idle_s,
                     floor_logs=run_dir / "logs" if floor else None,
                     on_step=lambda step: progress.update(task, description=step))
    # The targets are figures to read (a missed one is the finding): exit 0 on them.
    _render(report, as_json=as_json, verdict=False)


@app.command(epilog=EXIT_CODES_TARGETS,
             short_help="Gateway memory per open slow stream, on each engine wire.")
def memory(
    concurrency: Annotated[int, typer.Option(
        "--concurrency", "--streams", min=10, help="Slow streams held at once.")] = 1000,
    wire: Annotated[ListOption, typer.Option(
        help="Engine wires, each in turn: per_request, multiplexed (default: both).")
    ] = None,
    trace: Annotated[bool, typer.Option(help="Also run under tracemalloc: what each "
                                             "stream holds, by where it was made.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """The gateway's RSS per open stream (no lab needed: it starts a gateway and an
    engine on free ports): N slow streams (15 tokens 1 s apart) held at once, per
    engine wire, against the 40 KiB target; `--trace` adds the top allocations."""
    from streamlab.experiments.bench.memory import WIRES, bench_memory

    wires = tuple(split_list(wire, WIRES))
    if any(w not in WIRES for w in wires):
        raise typer.BadParameter(f"--wire {','.join(wires)!r}: {' or '.join(WIRES)}")
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("starting", total=None)
        report = bench_memory(concurrency, wires, trace=trace,
                              on_step=lambda step: progress.update(task, description=step))
    # The target is a figure to read (a miss is the finding): exit 0 on it.
    _render(report, as_json=as_json, verdict=False)


@app.command("engine-death", epilog=EXIT_CODES,
             short_help="An engine SIGKILL vs a 2 s engine-hop blip: time to the end.")
def engine_death(
    concurrency: Annotated[int, typer.Option(
        "--concurrency", "--streams", min=2, help="Resumable streams at once, a round.")] = 20,
    rounds: Annotated[int, typer.Option(
        "--repeat", min=1, help="Rounds of (blip, SIGKILL) per wire and window.")] = 3,
    window: Annotated[ListOption, typer.Option(
        "--window-s", "--window",
        help="The gateway's reattach_window_s, seconds, each in turn (the gateway "
             "restarted on each; default: its own default).")] = None,
    blip: Annotated[float, typer.Option(
        "--blip-s", "--blip", min=0.1, help="The engine-hop blip, seconds.")] = 2.0,
    wire: Annotated[ListOption, typer.Option(
        help="Engine wires, each in turn: per_request, multiplexed (default: multiplexed).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """A lab of its own (1 gateway on Redis, 2 engines; no running lab needed):
    resumable streams read through the edge, each round a blip of both engine
    hops (every stream must end whole), then a SIGKILL of one engine (its
    readers must get `event: retry`, then `error` generation_lost within the
    window + 1 s). Prints the resume delay after the blip and SIGKILL ->
    terminal event, p50/p99. Exits 1 unless every check held."""
    from streamlab.experiments.bench.engine_death import WIRES, bench_engine_death

    wires = tuple(split_list(wire, ("multiplexed",)))
    if any(w not in WIRES for w in wires):
        raise typer.BadParameter(f"--wire {','.join(wires)!r}: {' or '.join(WIRES)}")
    items = split_list(window)
    try:
        windows = tuple(float(w) for w in items)
    except ValueError:
        raise typer.BadParameter(f"--window-s {','.join(items)!r}: seconds") from None
    if any(w <= 0 for w in windows):
        raise typer.BadParameter(f"--window-s {','.join(items)!r}: each above 0")
    with experiment_exits(), _progress() as progress:
        task = progress.add_task("starting a lab", total=None)
        report = bench_engine_death(wires, windows or None, streams=concurrency,
                                    rounds=rounds, blip_s=blip,
                                    on_step=lambda step: progress.update(task, description=step))
    _render(report, as_json=as_json)
