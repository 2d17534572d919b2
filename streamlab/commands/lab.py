"""Lab commands: bring the lab up, look at it, talk to it, take it down."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Annotated

import grpc
import httpx
import typer
from rich.markup import escape
from rich.table import Table

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from services.common.tracing import trace_id_of
from services.gateway.settings import ENGINE_WIRES
from streamlab.commands.completion import complete_proxies
from streamlab.commands.conventions import AsJson, OutputConsole, fail, print_json
from streamlab.exit_codes import EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.lab.compose import ComposeLab, selected_target
from streamlab.lab.engine_backend import BackendChoiceError, BackendName, choose
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.nginx import NginxOptions
from streamlab.lab.processes import StartError, pid_alive
from streamlab.lab.proxies import PROXY_NAMES
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import Ports, console_url
from streamlab.lab.trace_timeline import client_headers, record_stream
from streamlab.paths import COMPOSE_NEEDS_A_CLONE, RUN_DIR_VAR, clone
from streamlab.paths import run_dir as default_run_dir

app = typer.Typer()
console = OutputConsole()
err = OutputConsole(stderr=True)

RunDir = Annotated[Path, typer.Option(
    help=f"Where logs, pids and rendered configs live (${RUN_DIR_VAR}; default: a clone's "
         ".run, else the user's state directory).")]
# AsJson: the result goes to stdout as one JSON document (an error's too:
# commands/conventions.py), anything else (spinners, warnings) to stderr.
# One default for every entry point, the pytest plugin's too (streamlab/paths.py).
DEFAULT_RUN_DIR = default_run_dir()


def attached(run_dir: Path, *, running: bool = True) -> LabTarget:
    """The lab `streamlab up` started from run_dir, or a clear exit if there is none.
    With STREAMLAB_TARGET=compose: the compose project, through its published ports.
    `running`: a lab whose processes are all gone (a reboot, an OOM kill) is no
    lab either (exit 3); False for what reads a dead lab too (its logs)."""
    if selected_target() == "compose":
        if clone() is None:
            fail(f"STREAMLAB_TARGET=compose: {COMPOSE_NEEDS_A_CLONE}", EXIT_USAGE)
        return ComposeLab.from_env()
    if not (run_dir / "state.json").exists():
        fail(f"No lab is running from {run_dir}. Start one with `streamlab up`.",
             EXIT_UNREACHABLE)
    lab = Lab.attach(run_dir)
    if running and not any(pid_alive(pid) for pid in lab.pids.values()):
        fail(f"The lab in {run_dir} is not running: none of its processes is alive (a "
             "reboot, or they were killed). `streamlab down` clears what it left, "
             "`streamlab up` starts a new one; `streamlab logs` still reads its logs.",
             EXIT_UNREACHABLE)
    return lab


def _not_for_compose(instead: str) -> None:
    # Compose owns the compose lab's lifecycle; two owners would fight over it.
    if selected_target() == "compose":
        fail(f"STREAMLAB_TARGET=compose: the compose lab is started and stopped by compose "
             f"itself: {instead}", EXIT_USAGE)


@app.command()
def up(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    backend: Annotated[BackendName, typer.Option(
        help="The engine's model: the timed fake, transformers (hf), or an "
             "OpenAI-compatible server (openai).")] = "fake",
    model: Annotated[str | None, typer.Option(
        help="hf: a model directory (save_pretrained) or hub name; openai: the model name "
             "to ask the upstream for.")] = None,
    device: Annotated[str | None, typer.Option(help="hf: auto, cpu, cuda, cuda:1 …")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="hf: auto, bfloat16, float16 or float32.")] = None,
    base_url: Annotated[str | None, typer.Option(
        help="openai: the upstream's base URL, e.g. http://127.0.0.1:8000/v1")] = None,
    api_key_env: Annotated[str | None, typer.Option(
        help="openai: the environment variable that holds the upstream's API key.")] = None,
    with_console: Annotated[bool, typer.Option(
        "--console/--no-console", help="Serve the lab console too (docs/console.md).")] = True,
    nginx_send_timeout_s: Annotated[float | None, typer.Option(
        "--nginx-send-timeout-s", "--nginx-send-timeout", min=0.1, metavar="SECONDS",
        help="How long nginx waits for a client that accepts no bytes before closing it "
             "(default 30). A few seconds makes slow-reader-edge quick to run.")] = None,
    gateways: Annotated[int, typer.Option(
        min=1, help="Gateway replicas behind nginx (least_conn), each with its own hop "
                    "(upstream, upstream-2, …; docs/topology.md).")] = 1,
    engines: Annotated[int, typer.Option(
        min=1, help="Engine replicas, each with its own hop (engine, engine-2, …); the "
                    "gateways balance them (round_robin, health-checked).")] = 1,
    store: Annotated[str | None, typer.Option(
        help="The gateways' resume store: memory or redis (Redis behind the `store` "
             "hop). Default: redis with more than one gateway, else memory.")] = None,
    proxy: Annotated[str, typer.Option(
        help=f"The proxy where nginx stands: {', '.join(PROXY_NAMES)} (installed on "
             "first use; docs/proxies.md).", autocompletion=complete_proxies)] = "nginx",
    proxy_config: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, metavar="FILE",
        help="Your own config for --proxy, with the lab's addresses as placeholders "
             "(docs/proxies.md: ${STREAMLAB_UPSTREAM} and the like).")] = None,
    engine_wire: Annotated[str | None, typer.Option(
        help="Gateway to engine: multiplexed (one Session per engine, the default) or "
             "per_request (a gRPC call a stream; docs/cancellation-and-backpressure.md).")] = None,
    tracing: Annotated[bool, typer.Option(
        "--tracing", help="Jaeger beside the lab; the gateways and engines export their spans "
                          "to it and log JSON (docs/tracing.md; `streamlab trace ID`).")] = False,
    as_json: AsJson = False,
) -> None:
    """Start the lab (detached) and print its services and URLs.

    Engine, Toxiproxy, gateway, nginx and the console, each a detached process
    whose logs and pids live in the run dir."""
    _not_for_compose("docker compose up --build -d")
    try:
        choice = choose(backend, model=model, device=device, dtype=dtype, base_url=base_url,
                        api_key_env=api_key_env)
    except BackendChoiceError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if (run_dir / "state.json").exists():
        lab = Lab.attach(run_dir)
        if any(s["running"] for s in lab.status().values()):
            fail("A lab is already up (see `streamlab status`); `streamlab down` first.")
    if store not in (None, "memory", "redis"):
        raise typer.BadParameter(f"--store {store!r}: one of memory, redis")
    if proxy not in PROXY_NAMES:
        raise typer.BadParameter(f"--proxy {proxy!r}: one of {', '.join(PROXY_NAMES)}")
    if engine_wire is not None and engine_wire not in ENGINE_WIRES:
        raise typer.BadParameter(f"--engine-wire {engine_wire!r}: one of {', '.join(ENGINE_WIRES)}")
    gateway_env = dict(choice.gateway_env)
    if engine_wire is not None:
        gateway_env["STREAMLAB_GATEWAY_ENGINE_WIRE"] = engine_wire
    options = LabOptions(run_dir=run_dir, engine_env=choice.engine_env,
                         gateway_env=gateway_env, console=with_console,
                         gateways=gateways, engines=engines, store=store,
                         proxy=proxy, proxy_config=proxy_config.resolve() if proxy_config else None,
                         tracing=tracing)
    if nginx_send_timeout_s is not None:
        options.nginx = NginxOptions(send_timeout_s=nginx_send_timeout_s)
    if choice.engine_ready_timeout_s is not None:
        options.engine_ready_timeout_s = choice.engine_ready_timeout_s
    try:
        lab = Lab(Ports.load(), options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _install_proxy(lab)
    _warn_idle_cuts(lab)
    try:
        with (err if as_json else console).status(f"starting the lab ({backend} model)…"):
            lab.up()
    except (StartError, FileNotFoundError) as exc:
        # A proxy's refusal quotes its config ("[/path/haproxy.cfg:3]"): text
        # from outside is printed as it is, never read as markup (fail's is plain).
        fail(f"streamlab up failed: {exc}")
    if as_json:
        print_json(up_json(lab, with_console, run_dir))
        return
    _print_status(lab)
    console.print(f"\nTry: [bold]streamlab chat \"hello\"[/]   or   curl -N {lab.edge_url}"
                  "/v1/chat/completions -H 'content-type: application/json' "
                  "-d '{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'")
    if lab.edge_proxy == "nginx":  # the HTTP/2 edge is nginx's TLS listener
        console.print(f"HTTP/2: curl --http2 --cacert {escape(str(lab.tls.ca_cert))} "
                      f"{lab.edge_h2_url}/nginx-health"
                      "   (the lab's CA; docs/http2.md says how a browser trusts it)")
    if with_console:
        console.print(f"Console: [bold]{console_url(lab.ports)}/[/]  (streams, toxics, "
                      "presets and Stop in the browser)")
    console.print(f"Logs: {escape(str(run_dir / 'logs'))}   Stop: [bold]streamlab down[/]")


def _install_proxy(lab: Lab) -> None:
    """The first `--proxy X` installs X with the project's script."""
    from streamlab.lab.proxies import ProxyNotInstalled, install

    try:
        lab.proxy.find()
    except ProxyNotInstalled:
        # stderr: progress, never part of `up --json`'s document.
        if clone() is not None:  # an installed wheel has no script: install() says how
            err.print(f"{lab.edge_proxy} is not installed: installing it "
                      "(scripts/install_proxies.sh)")
        try:
            install(lab.edge_proxy)
        except ProxyNotInstalled as exc:
            fail(f"streamlab up failed: {exc}")


def _warn_idle_cuts(lab: Lab) -> None:
    """A user's config whose idle timeout is no longer than the gateway's
    heartbeat interval cuts streams even with heartbeats: say which directive."""
    from streamlab.lab.proxies.idle import fill, idle_timeouts

    config = lab.options.proxy_config
    heartbeat_s = lab.options.gateway_settings().heartbeat_s
    if config is None or heartbeat_s <= 0:
        return
    text = fill(config.read_text(), lab.proxy.environment(lab.proxy_setup))
    for timeout in idle_timeouts(lab.edge_proxy, text):
        if timeout.seconds > heartbeat_s:
            continue
        # The file's own words (its path, a directive): printed as they are.
        err.print(f"[yellow]{escape(f'{config}: {timeout.describe()}')} is not longer than "
                  f"the gateway's {heartbeat_s:g} s heartbeat: it cuts any stream that pauses[/]")


def up_json(lab: Lab, with_console: bool, run_dir: Path) -> dict[str, object]:
    """What `up` prints, as data: each service (as `status --json`) and the URLs to use."""
    urls = {"edge": lab.edge_url, "edge_h2": lab.edge_h2_url, "gateway": lab.gateway_url,
            "toxiproxy": lab.toxiproxy_url,
            "console": f"{console_url(lab.ports)}/" if with_console else None}
    return {"services": lab.status(), "edge_proxy": lab.edge_proxy, "urls": urls,
            "ca_cert": str(lab.tls.ca_cert),
            "logs": str(run_dir / "logs")}


@app.command()
def down(run_dir: RunDir = DEFAULT_RUN_DIR, as_json: AsJson = False) -> None:
    """Stop every service of the lab (SIGTERM, grace, SIGKILL).

    With no lab up there is nothing to stop: it says so and exits 0 (`make
    down` twice is no error)."""
    _not_for_compose("docker compose down")
    if not (run_dir / "state.json").exists():
        if as_json:
            print_json({"stopped": [], "run_dir": str(run_dir), "was_up": False})
        else:
            console.print("No lab is running.")
        return
    lab = Lab.attach(run_dir)
    services = list(lab.pids)
    with (err if as_json else console).status("stopping the lab…"):
        lab.down()
    if as_json:
        print_json({"stopped": services, "run_dir": str(run_dir), "was_up": True})
        return
    console.print("Lab stopped.")


@app.command()
def status(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Each service, its address and whether it answers."""
    lab = attached(run_dir)
    if as_json:
        print_json(lab.status())
        return
    _print_status(lab)


def _print_status(lab: LabTarget) -> None:
    table = Table("service", "address", "pid", "health")
    for name, entry in lab.status().items():
        health = "[green]healthy[/]" if entry["healthy"] else "[red]down[/]"
        # The edge proxy's row: the proxy that stands in nginx's slot.
        table.add_row(entry.get("proxy", name), entry["url"], str(entry["pid"] or "-"), health)
    console.print(table)
    console.print(f"edge proxy: {lab.edge_proxy}")
    _print_engine_load(lab)
    ports = lab.ports
    console.print(f"metrics: {lab.gateway_url}/metrics · engine "
                  f"http://{ports.host}:{ports.engine_metrics_port}/metrics")


def _print_engine_load(lab: LabTarget) -> None:
    """The engine's model, slots and queue, from GetStats (silent if it does not answer)."""
    try:
        stats = lab.engine_stats()
    except grpc.RpcError:
        return
    load = stats.load
    line = f"engine model: {stats.backend}"
    if load.device:
        line += f" on {load.device}"
    line += (f" · running {load.running}/{load.running_limit}"
             f" · queue {load.queue_waiting}/{load.queue_limit} waiting")
    if load.device_memory_allocated:
        line += f" · {load.device_memory_allocated / 2**20:.0f} MiB on the device"
    console.print(line, markup=False)  # the engine's own words (its backend, device)


@app.command()
def chat(
    prompt: str,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    location: Annotated[str, typer.Option(
        "--location", "--path", help="The nginx location to go through, e.g. /buffered/.")
    ] = "/",
    prefill_ms: Annotated[int | None, typer.Option(help="Fake model prefill delay.")] = None,
    gap_ms: Annotated[int | None, typer.Option(help="Fake model gap between tokens.")] = None,
    tokens: Annotated[int | None, typer.Option(help="How many tokens to generate.")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        help="The request's max_tokens: what bounds a real model's answer.")] = None,
    timeout_s: Annotated[float, typer.Option(help="Idle timeout between bytes.")] = 30.0,
    request_id: Annotated[str | None, typer.Option(help="X-Request-Id to send.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the reply as one JSON object when it ends (text, tokens, "
                       "TTFT, total, request id, finish reason) instead of streaming it.")
    ] = False,
) -> None:
    """Stream a reply through the edge, printing tokens as they arrive.

    On a lab up with --tracing it starts a trace (`traceparent`) and keeps its
    own timings, so `streamlab trace ID` draws the stream from the client on."""
    lab = attached(run_dir)
    url = f"{lab.edge_url}{location.rstrip('/')}/v1/chat/completions"
    body = chat_body(prompt, max_tokens=max_tokens, prefill_ms=prefill_ms, token_gap_ms=gap_ms,
                     answer_tokens=tokens)
    traced = isinstance(lab, Lab) and lab.options.tracing
    headers: dict[str, str] | None = {"X-Request-Id": request_id} if request_id else None
    if traced:
        headers = client_headers(request_id or uuid.uuid4().hex)

    async def run() -> None:
        timeout = httpx.Timeout(timeout_s, connect=5.0)
        started_unix, started = time.time(), time.perf_counter()
        async with httpx.AsyncClient(timeout=timeout) as client:
            result = await stream_chat(
                client, url, body, headers=headers,
                on_token=None if as_json else (
                    lambda t: console.print(t, end="", soft_wrap=True, markup=False,
                                            highlight=False)))
        if traced and headers is not None:
            # The client's clock beside the proxy's line and the spans (`streamlab trace`).
            record_stream(lab.run_dir, headers["X-Request-Id"], headers["traceparent"],
                          started_unix, result, time.perf_counter() - started)
        if as_json:
            print_json({**chat_json(result), **(
                {"trace_id": trace_id_of(headers["traceparent"])}
                if traced and headers is not None else {})})
            if result.error:
                raise typer.Exit(1)
            return
        console.print()
        if result.error:
            # The server's own words, printed as they are.
            err.print(f"[red]error:[/] {escape(str(result.error.get('message')))} "
                      f"(HTTP {result.status})")
        ttft = f"{result.ttft_s * 1000:.0f} ms" if result.ttft_s is not None else "-"
        console.print(f"[dim]TTFT {ttft} · total {result.total_s * 1000:.0f} ms · "
                      f"{len(result.texts)} tokens · request {escape(str(result.request_id))}[/]",
                      soft_wrap=True)  # the id whole on its line, to copy
        if traced and result.request_id:
            extra = "" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}"
            console.print(f"[dim]its timeline: streamlab trace "
                          f"{escape(str(result.request_id))}{escape(extra)}[/]",
                          highlight=False, soft_wrap=True)
        if result.error:
            raise typer.Exit(1)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        err.print("\n[yellow]interrupted[/]: the connection is closed, the engine cancels.")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def chat_json(result: StreamResult) -> dict[str, object]:
    """`chat --json`: the reply and its timings, the figures the human line shows."""
    return {"text": result.text, "tokens": len(result.texts), "status": result.status,
            "ttft_s": result.ttft_s, "total_s": result.total_s,
            "request_id": result.request_id, "finish_reason": result.finish_reason,
            "done": result.done, "usage": result.usage, "error": result.error}
