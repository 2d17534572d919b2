"""Tracing and structured logs for the services, off by default.

Trace context is W3C's `traceparent` (`00-<trace id>-<span id>-<flags>`). A
service traces when the standard OpenTelemetry variables point it at an OTLP
endpoint:

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318   (or ..._TRACES_ENDPOINT)
    OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1   (sampling)
    OTEL_BSP_SCHEDULE_DELAY=500                          (export batches every 0.5 s)
    OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none  (off again)

Off (no endpoint), `tracer()` is None and nothing of OpenTelemetry is
imported: the call sites test `tracer() is not None` once per stream, and
that is the whole cost. On, the SDK's tracer provider exports over OTLP/HTTP
(protobuf) in batches, from a thread of its own.

Logs: `configure_logging` writes plain lines (`%(asctime)s %(name)s
%(message)s`, as before) or, with `STREAMLAB_LOG_FORMAT=json` (the lab sets it
with tracing), one JSON object per line carrying the request id and trace id
of the request being served (`log_context`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def parse_traceparent(value: str | None) -> tuple[str, str, int] | None:
    """(trace id, parent span id, flags) of a valid `traceparent`, else None
    (W3C: version ff and all-zero ids are invalid)."""
    if not value:
        return None
    match = TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, int(flags, 16)


def trace_id_of(traceparent: str | None) -> str | None:
    parsed = parse_traceparent(traceparent)
    return parsed[0] if parsed else None


def new_traceparent(sampled: bool = True) -> str:
    """A fresh root context, as a client starts one (no SDK needed)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"


def tracing_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* variables ask this process to export traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class ServiceTracer:
    """The SDK's tracer for one service, built only when tracing is on."""

    def __init__(self, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            TraceFlags,
            set_span_in_context,
        )

        name = os.environ.get("OTEL_SERVICE_NAME") or service_name
        # The sampler comes from OTEL_TRACES_SAMPLER (parent-based always-on by
        # default), the exporter's endpoint and headers from OTEL_EXPORTER_OTLP_*,
        # the batching from OTEL_BSP_*.
        self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer: Tracer = self.provider.get_tracer("streamlab")
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT,
                       "internal": SpanKind.INTERNAL, "consumer": SpanKind.CONSUMER}
        self._parent = (NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context)

    def start(self, name: str, traceparent: str | None, *, kind: str = "server",
              start_ns: int | None = None, attributes: Mapping[str, Any] | None = None) -> Span:
        """A span, child of `traceparent` when it is valid (else a new trace)."""
        non_recording, span_context, trace_flags, in_context = self._parent
        context = None
        parsed = parse_traceparent(traceparent)
        if parsed is not None:
            trace_id, span_id, flags = parsed
            parent = span_context(int(trace_id, 16), int(span_id, 16), is_remote=True,
                                  trace_flags=trace_flags(flags & 1))
            context = in_context(non_recording(parent))
        return self._tracer.start_span(name, context=context, kind=self._kinds[kind],
                                       start_time=start_ns, attributes=attributes)

    def shutdown(self) -> None:
        self.provider.shutdown()


def traceparent_of(span: Span) -> str:
    """The `traceparent` that makes the next hop a child of `span`."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 1:02x}"


def trace_id_hex(span: Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


_tracer: ServiceTracer | None = None


def setup(service_name: str) -> ServiceTracer | None:
    """Build this process's tracer if the OTEL_* variables ask for one (at start-up)."""
    global _tracer
    if _tracer is None and tracing_configured():
        _tracer = ServiceTracer(service_name)
    return _tracer


def tracer() -> ServiceTracer | None:
    """This process's tracer, or None: tracing off."""
    return _tracer


def reset_for_tests(value: ServiceTracer | None = None) -> None:
    global _tracer
    _tracer = value


def otlp_endpoint() -> str:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))


def now_ns() -> int:
    return time.time_ns()


# The trace context of the request this task serves, for work it starts on
# others' behalf (a resume reader's GET that takes a lost replica's stream over:
# the re-attach joins the reader's trace). Set only with tracing on.
incoming_traceparent: ContextVar[str | None] = ContextVar(
    "streamlab_incoming_traceparent", default=None)


# ---- logs ---------------------------------------------------------------------

# (request id, trace id) of the request this task serves, for the JSON log lines.
log_context: ContextVar[tuple[str, str | None] | None] = ContextVar(
    "streamlab_log_context", default=None)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the request id
    and trace id of the request being served (or passed as `extra=`)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = log_context.get()
        request_id = getattr(record, "request_id", None) or (context[0] if context else None)
        trace_id = getattr(record, "trace_id", None) or (context[1] if context else None)
        if request_id:
            doc["request_id"] = request_id
        if trace_id:
            doc["trace_id"] = trace_id
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def json_logs(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("STREAMLAB_LOG_FORMAT", "text").strip().lower() == "json"


def configure_logging(level: int = logging.INFO) -> None:
    """The services' root logger: plain lines, or JSON lines (module docstring)."""
    if not json_logs():
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
