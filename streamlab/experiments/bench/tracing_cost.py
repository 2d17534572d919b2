"""`streamlab bench scale --tracing off,on,0.1` (cell g): what tracing costs the
lab's own processes, per stream set-up and per paced token, side by side.

    modes     off    the gateways and engines as a lab without --tracing starts
                     them: no OTLP endpoint, so the OpenTelemetry SDK is never
                     imported (services/common/tracing.py), plain-text logs
              on     every stream traced, exported to the lab's Jaeger (OTLP/HTTP,
                     batched) and logged as JSON: what `streamlab up --tracing` runs
              0.1    on, sampled: OTEL_TRACES_SAMPLER=parentbased_traceidratio with
                     OTEL_TRACES_SAMPLER_ARG=0.1 (any ratio in (0, 1]); the bench's
                     client sends no traceparent, so the gateway's sampler decides
              before with a baseline revision (`--tracing-baseline REV`): the
                     gateways and engines of that revision's services/ and
                     streamlab_protocol/ (`git archive`, run with PYTHONSAFEPATH and
                     PYTHONPATH pointing there), as off otherwise: the code before
                     tracing, beside off in the same rounds
    a round   each mode in turn (the order reversed every other round, so a drift
              in the machine's load lands on both sides): the gateways and the
              engines restarted with the mode's environment, then `bench setup`'s
              cells on the lab (setup_cost.run_setup: idle, N two-token set-ups,
              S paced streams), CPU from schedstat per process
    figures   each mode's median over the rounds, per process; `tracing_cost_*`
              the median of on (or the ratio) minus off's, and `off_spread_*`
              the spread of off's own rounds: the noise the cost stands beside

A lab up with --tracing (Jaeger beside it) for any mode but off, and one this
tool started (it restarts services): like the other cells of `bench scale`.
Every setting is put back at the end, the services restarted on it.
"""

from __future__ import annotations

import contextlib
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamlab.experiments.bench.setup_cost import PROCESSES, SetupRun, run_setup
from streamlab.experiments.bench.stats import rounded, summary
from streamlab.experiments.report import Figure, Figures, Report, Table
from streamlab.lab.target import LabTarget, MissingCapability

MODES = ("off", "on")
BEFORE = "before"  # the baseline revision's services, tracing off (it had none)
DEFAULT_STREAMS, DEFAULT_RATE = 500, 100.0
DEFAULT_PACED = (60, 100, 20)  # streams, tokens, step ms
SAMPLER = "parentbased_traceidratio"


def check_mode(mode: str) -> str:
    """`off`, `on`, or a sampling ratio in (0, 1]; ValueError otherwise."""
    if mode in MODES:
        return mode
    try:
        ratio = float(mode)
    except ValueError:
        raise ValueError(f"tracing mode {mode!r}: off, on or a ratio such as 0.1") from None
    if not 0 < ratio <= 1:
        raise ValueError(f"tracing ratio {mode!r}: above 0, at most 1")
    return mode


def mode_env(mode: str, baseline: Path | None = None) -> dict[str, str]:
    """What the mode lays over a traced lab's env for the gateways and engines
    (`before`: the services from the `baseline` tree, not the clone's)."""
    if mode == BEFORE:
        if baseline is None:
            raise ValueError("tracing mode before needs the baseline's tree")
        # The cwd (the clone) off sys.path, the tree first on it.
        return {**mode_env("off"), "PYTHONSAFEPATH": "1", "PYTHONPATH": str(baseline)}
    if mode == "off":
        # As a lab without --tracing: no endpoint (the SDK never imported), text logs.
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "STREAMLAB_LOG_FORMAT": "text"}
    if mode == "on":
        return {}
    return {"OTEL_TRACES_SAMPLER": SAMPLER, "OTEL_TRACES_SAMPLER_ARG": mode}


@dataclass(frozen=True)
class TracingRound:
    round: int
    mode: str
    run: SetupRun


def baseline_tree(revision: str, into: Path) -> Path:
    """The services (and the wire they share) of `revision` of this clone, for the
    `before` mode: `git archive`, nothing checked out."""
    from streamlab.lab.topology import REPO_ROOT

    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", revision, "services",
             "streamlab_protocol"], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise MissingCapability("git clone", f"--tracing-baseline {revision}: git archive "
                                f"failed ({exc})") from exc
    with tempfile.TemporaryFile() as spool:
        spool.write(archive)
        spool.seek(0)
        with tarfile.open(fileobj=spool) as tar:
            tar.extractall(into, filter="data")
    return into


@contextlib.contextmanager
def tracing_modes(lab: LabTarget, baseline: Path | None = None
                  ) -> Iterator[Callable[[str], None]]:
    """Yield `use(mode)`: the gateways and engines restarted on that mode's env.
    Their env put back (and them restarted on it) at the end."""
    from streamlab.lab.local import Lab

    if not isinstance(lab, Lab):
        raise MissingCapability("pids", "bench scale --tracing restarts the gateway and engine")
    envs = (lab.options.gateway_env, lab.options.engine_env)
    saved = tuple(dict(env) for env in envs)
    names = (*lab.engine_names, *lab.gateway_names)

    def restart() -> None:
        # One at a time, engines first: a start waits for the whole chain to
        # answer, which needs the others up.
        for name in names:
            lab.stop_service(name)
            lab.start_service(name)

    def use(mode: str) -> None:
        for env, before in zip(envs, saved, strict=True):
            env.clear()
            env.update({**before, **mode_env(mode, baseline)})
        restart()

    try:
        yield use
    finally:
        for env, before in zip(envs, saved, strict=True):
            env.clear()
            env.update(before)
        restart()


def run_tracing_cost(lab: LabTarget, modes: Sequence[str] = MODES, *, rounds: int = 2,
                     streams: int = DEFAULT_STREAMS, rate: float = DEFAULT_RATE,
                     paced: tuple[int, int, int] | None = DEFAULT_PACED, idle_s: float = 1.0,
                     baseline: str | None = None,
                     on_step: Callable[[str], None] = lambda step: None) -> list[TracingRound]:
    """`rounds` rounds of every mode (and `before`, the `baseline` revision's
    services, first in each round's order when given)."""
    modes = [check_mode(m) for m in modes]
    if any(m != "off" for m in modes) and not getattr(lab.options, "tracing", False):
        raise MissingCapability("tracing", "bench scale --tracing on exports to the lab's "
                                "Jaeger (`streamlab down`, then `streamlab up --tracing`)")
    if baseline is not None:
        modes = [BEFORE, *modes]
    out: list[TracingRound] = []
    with contextlib.ExitStack() as stack:
        tree = None
        if baseline is not None:
            tree = baseline_tree(baseline, Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="streamlab-baseline-"))))
        use = stack.enter_context(tracing_modes(lab, tree))
        for number in range(1, rounds + 1):
            order = modes if number % 2 else list(reversed(modes))
            for mode in order:
                on_step(f"cell g: round {number}, tracing {mode}")
                use(mode)
                out.append(TracingRound(number, mode, run_setup(
                    lab, streams=streams, rate=rate, paced=paced, idle_s=idle_s)))
    return out


def tracing_report(runs: Sequence[TracingRound]) -> Report:
    """Each round a row; per mode and process the median set-up ms and paced
    µs/token; the cost of each traced mode over off, beside off's own spread."""
    modes = list(dict.fromkeys(r.mode for r in runs))
    processes = (*PROCESSES, "client")
    figures: Figures = {"rounds": max((r.round for r in runs), default=0),
                        "modes": ",".join(modes)}
    medians: dict[tuple[str, str, str], float | None] = {}
    for mode in modes:
        mine = [r.run for r in runs if r.mode == mode]
        for process in processes:
            for kind, values in (("setup_ms", [m.setup_ms().get(process) for m in mine]),
                                 ("paced_us", [m.paced_us().get(process) for m in mine])):
                stats = summary(values)
                medians[(kind, process, mode)] = stats["median"]
                figures[f"{kind}_{process}_{mode}"] = rounded(stats["median"],
                                                              3 if kind == "setup_ms" else 1)
                if mode == "off" and stats["max"] is not None and stats["min"] is not None:
                    figures[f"off_spread_{kind}_{process}"] = rounded(
                        stats["max"] - stats["min"], 3 if kind == "setup_ms" else 1)
    for mode in modes:
        if mode == "off":
            continue
        for process in processes:
            for kind in ("setup_ms", "paced_us"):
                base, traced = medians.get((kind, process, "off")), medians.get(
                    (kind, process, mode))
                if base is None or traced is None:
                    continue
                digits = 3 if kind == "setup_ms" else 1
                figures[f"tracing_cost_{kind}_{process}_{mode}"] = rounded(traced - base, digits)
                if base > 0:
                    figures[f"tracing_ratio_{kind}_{process}_{mode}"] = rounded(traced / base, 2)
    rows: list[tuple[Figure, ...]] = []
    for r in runs:
        setup, per_token = r.run.setup_ms(), r.run.paced_us()
        rows.append((r.round, r.mode, r.run.setup.load.completed,
                     *(rounded(setup.get(p), 3) for p in ("gateway", "engine")),
                     *(rounded(per_token.get(p), 1) for p in ("gateway", "engine")),
                     round(r.run.setup.loadavg[0], 2)))
    first = runs[0].run if runs else None
    caption = ""
    if first is not None:
        caption = (f"{first.streams} two-token set-ups at {first.rate:g}/s"
                   + (" · paced: {} streams x {} tokens at {} ms".format(*first.paced_shape)
                      if first.paced_shape else "")
                   + " · gateways and engines restarted per mode; CPU from schedstat, "
                     "idle taken off")
    rounds_table = Table("tracing rounds", ("round", "tracing", "set-ups ok",
                                            "gateway set-up ms", "engine set-up ms",
                                            "gateway paced µs/token", "engine paced µs/token",
                                            "load"), tuple(rows), caption=caption)
    cost_rows: list[tuple[Figure, ...]] = []
    for process in ("gateway", "engine"):
        for kind, unit in (("setup_ms", "set-up ms/stream"), ("paced_us", "paced µs/token")):
            cost_rows.append((
                process, unit, *(figures.get(f"{kind}_{process}_{m}") for m in modes),
                *(figures.get(f"tracing_cost_{kind}_{process}_{m}") for m in modes
                  if m != "off"),
                figures.get(f"off_spread_{kind}_{process}")))
    cost_table = Table("tracing cost", ("process", "figure", *modes,
                                        *(f"{m} − off" for m in modes if m != "off"),
                                        "off's spread"), tuple(cost_rows),
                       caption="medians over the rounds; off's spread: max − min of its "
                               "own rounds (the noise)")
    return Report("bench scale", "tracing", story="what tracing costs per stream set-up and "
                  "per paced token: off, on (exported to Jaeger), sampled", figures=figures,
                  tables=(cost_table, rounds_table))
