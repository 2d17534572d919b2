"""The proxy and client scenarios: a stream held back, cut, slowed or misread
between the engine and the screen, with the setup that breaks it, the one that
fixes it, and the measured checks that tell them apart. Data only; measures.py
does the work. The other families declare theirs beside their own measures
(registry.py lists them all, in catalogue order)."""

from __future__ import annotations

from streamlab.experiments.report import Check
from streamlab.experiments.scenarios.measures import sliced_reads, sse_stream, websocket_chat
from streamlab.experiments.scenarios.model import Scenario, Setup, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability
from streamlab.lab.toxiproxy import Toxic

# Above the tolerance, so shifted and unshifted TTFTs never overlap, and below
# the gateway's gRPC keepalive timeout (1 s in the test lab): a ping answered
# later than that makes the gateway declare the engine hop dead ("ping timeout").
LATENCY_MS = 600
SLOW_RATE_KB_S = 1  # below what a 20 tokens/s stream needs (~3 KB/s)
FAST_RATE_KB_S = 64  # far above it


def _fixed_ttft(t: Timing) -> float:
    """The bar for a stream that was not held back: TTFT ≤ prefill + 2 gaps + tolerance."""
    return t.prefill_s + 2 * t.gap_s + t.tolerance_s


STREAMS = (
    Check("done", "==", True, "the reply ends with [DONE]"),
    Check("ttft_s", "<=", _fixed_ttft, "first token right after prefill"),
)
LUMP = (
    Check("first_byte_share", ">=", 0.9, "nothing arrives before 90 % of the total time"),
    Check("done", "==", True, "the reply is whole, only late"),
)


def _buffering(name: str, summary: str, broken: str, fixed: str, fixed_story: str) -> Scenario:
    return Scenario(
        name=name, summary=summary, measure=sse_stream,
        broken=Variant(Setup(location=broken, accept_encoding="gzip"), LUMP,
                       f"{broken}: the whole answer arrives in one lump at the end"),
        fixed=Variant(Setup(location=fixed, accept_encoding="gzip"), STREAMS, fixed_story),
        shown=("first_byte_s", "ttft_s", "total_s", "first_byte_share", "token_spread_share",
               "tokens", "done"),
    )


def _latency(hop: str) -> Scenario:
    toxic = Toxic("latency", {"latency": LATENCY_MS, "jitter": 0}, "downstream")
    latency_s = LATENCY_MS / 1000
    return Scenario(
        name=f"latency-{hop}",
        summary=f"{LATENCY_MS} ms latency on the {hop} hop shifts TTFT by that much",
        measure=sse_stream,
        broken=Variant(
            Setup(toxics=((hop, toxic),)),
            (Check("ttft_shift_s", ">=", latency_s - 0.05, "at least the added latency"),
             # Typically latency + 30 ms; the bound is loose because a loaded CI
             # machine once added 0.6 s more on the engine hop. What it rules
             # out is the latency adding up per chunk (20 tokens: 12 s).
             Check("ttft_shift_s", "<=", lambda t: 2 * latency_s + t.tolerance_s,
                   "not one latency per chunk: toxiproxy delays the stream as a whole"),
             Check("done", "==", True)),
            f"latency toxic ({LATENCY_MS} ms, downstream) on {hop}"),
        fixed=Variant(
            Setup(),
            (Check("ttft_shift_s", "<=", lambda t: t.tolerance_s, "TTFT is the model's own"),
             Check("done", "==", True)),
            "no toxic: TTFT ≈ prefill + one gap"),
        needs=frozenset({Capability.TOGGLE_HOPS}),
        shown=("ttft_s", "ttft_shift_s", "total_s", "tokens", "done"),
    )


register(
    _buffering(
        "buffering",
        "nginx buffering + gzip hold a stream back to one lump; proxy_buffering off fixes it",
        "/buffered/", "/",
        "/: proxy_buffering off, nginx flushes per upstream read (gzip too)"),
    _buffering(
        "buffering-header",
        "the app's X-Accel-Buffering: no alone fixes a buffering location, unless the "
        "proxy ignores it",
        "/buffered/", "/buffered-accel/",
        "/buffered-accel/: same buffering and gzip, but nginx honours X-Accel-Buffering: no"),
    _buffering(
        "gzip",
        "compressing text/event-stream behind a buffering proxy holds the stream; "
        "gzip off fixes it",
        "/buffered/", "/buffered-no-gzip/",
        "/buffered-no-gzip/: same buffering, no compression: partial buffers pass on"),
    Scenario(
        name="idle-cut",
        summary="a think pause longer than nginx's proxy_read_timeout cuts the stream; "
                "heartbeats keep it alive",
        measure=sse_stream,
        broken=Variant(
            Setup(location="/short-timeout/", heartbeat="off", think_pause=True),
            (Check("done", "==", False, "no [DONE]: the client sees a truncated stream"),
             Check("error_code", "==", "transport",
                   "the transfer ends early: incomplete chunked read (curl exit 18)"),
             Check("nginx_upstream_timeouts", ">=", 1, "nginx logs 'upstream timed out'"),
             Check("gateway_log_errors", "==", 0, "and the gateway logs nothing wrong"),
             Check("silence_before_end_s", ">=", lambda t: 0.75 * t.idle_timeout_s,
                   "cut after about the idle timeout of silence (measured from the client's "
                   "last byte, which it saw a little after nginx did)")),
            "no heartbeat: silence for think_s > idle timeout"),
        fixed=Variant(
            Setup(location="/short-timeout/", heartbeat="on", think_pause=True),
            (Check("done", "==", True, "the whole reply arrives"),
             Check("tokens", "==", lambda t: t.tokens),
             Check("pings", ">=", 1, "pings filled the pause (and the parser skipped them)"),
             Check("nginx_upstream_timeouts", "==", 0)),
            "`: ping` every heartbeat_s < idle timeout"),
        needs=frozenset({Capability.LOGS}),
        shown=("tokens", "done", "client_error", "pings", "silence_before_end_s", "total_s",
               "nginx_upstream_timeouts", "gateway_log_errors"),
    ),
    Scenario(
        name="client-watchdog",
        summary="a black-holed edge: a client without a read timeout hangs; with one, it "
                "gets a clear error within its deadline",
        measure=sse_stream,
        broken=Variant(
            Setup(toxics=(("edge", Toxic("timeout", {"timeout": 0})),), watchdog=False,
                  patience="short"),
            (Check("hung", "==", True, "still waiting long after the reply should have ended"),),
            "timeout toxic (0 = black hole) on edge, client with no read timeout"),
        fixed=Variant(
            Setup(toxics=(("edge", Toxic("timeout", {"timeout": 0})),), watchdog=True),
            (Check("hung", "==", False),
             Check("error_code", "==", "timeout", "a clear timeout error, not a hang"),
             Check("total_s", "<=", lambda t: t.watchdog_s + t.tolerance_s,
                   "within the watchdog's deadline")),
            "same black hole, client read timeout = watchdog_s"),
        needs=frozenset({Capability.TOGGLE_HOPS}),
        shown=("hung", "error_code", "client_error", "total_s", "tokens"),
    ),
    Scenario(
        name="websocket-upgrade",
        summary="a WebSocket through a location without HTTP/1.1 + Upgrade/Connection fails",
        measure=websocket_chat,
        broken=Variant(
            Setup(location="/no-upgrade/"),
            (Check("handshake_status", "!=", 101, "the upgrade is refused"),
             Check("tokens", "==", 0)),
            "/no-upgrade/: nginx drops the hop-by-hop Upgrade/Connection headers"),
        fixed=Variant(
            Setup(location="/"),
            (Check("handshake_status", "==", 101),
             Check("tokens", "==", lambda t: t.tokens),
             Check("done", "==", True)),
            "/: proxy_http_version 1.1 + Upgrade + Connection forwarded"),
        shown=("handshake_status", "client_error", "tokens", "done", "ttft_s"),
    ),
    Scenario(
        name="slicer",
        summary="events split across reads and merged several per read (slicer on edge and "
                "upstream): a line parser still yields exactly the events sent",
        measure=sliced_reads,
        broken=Variant(
            Setup(toxics=(
                ("upstream", Toxic("slicer", {"average_size": 24, "size_variation": 16,
                                              "delay": 2000})),
                ("edge", Toxic("slicer", {"average_size": 48, "size_variation": 32,
                                          "delay": 1000}))),
                  parser="naive", read_pause_s=0.1),
            (Check("split_reads", ">=", 1), Check("events_exact", "==", False,
                                                  "a chunk-per-event parser loses events")),
            "a parser that treats each read as one event"),
        fixed=Variant(
            Setup(toxics=(
                ("upstream", Toxic("slicer", {"average_size": 24, "size_variation": 16,
                                              "delay": 2000})),
                ("edge", Toxic("slicer", {"average_size": 48, "size_variation": 32,
                                          "delay": 1000}))),
                  parser="sse", read_pause_s=0.1),
            (Check("split_reads", ">=", 1), Check("merged_reads", ">=", 1),
             Check("events_exact", "==", True), Check("text_matches", "==", True)),
            "streamlab_protocol/sse.py: parses lines, not reads"),
        needs=frozenset({Capability.TOGGLE_HOPS}),
        shown=("reads", "split_reads", "merged_reads", "events_sent", "events_parsed",
               "parse_errors", "events_exact", "text_matches"),
    ),
    _latency("edge"),
    _latency("upstream"),
    _latency("engine"),
    Scenario(
        name="bandwidth",
        summary="a bandwidth cap below the stream's byte rate makes tokens arrive later "
                "and later; above it, streaming is unaffected",
        measure=sse_stream,
        broken=Variant(
            Setup(toxics=(("edge", Toxic("bandwidth", {"rate": SLOW_RATE_KB_S})),)),
            (Check("last_token_lag_s", ">=", lambda t: 2 * t.tolerance_s,
                   "the last token is late: the cap, not the model, sets the pace"),
             Check("done", "==", True)),
            f"bandwidth toxic {SLOW_RATE_KB_S} KB/s on edge"),
        fixed=Variant(
            Setup(toxics=(("edge", Toxic("bandwidth", {"rate": FAST_RATE_KB_S})),)),
            (Check("last_token_lag_s", "<=", lambda t: t.tolerance_s), Check("done", "==", True)),
            f"bandwidth toxic {FAST_RATE_KB_S} KB/s: above the stream's rate"),
        needs=frozenset({Capability.TOGGLE_HOPS}),
        shown=("stream_kb_per_s", "ttft_s", "last_token_lag_s", "total_s", "tokens", "done"),
    ),
)
