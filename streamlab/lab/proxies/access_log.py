"""A proxy's JSON access-log line in one shape (`AccessLine`), and the small
readers each proxy's `access_line` uses on its own fields.

    request_id, trace_id, status, bytes   what the client asked and got
    start, end                            unix seconds
    request_time_s                        the proxy's whole time on it
    upstream_header_s, upstream_response_s
                                          the gateway's, where the proxy logs them
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.common.tracing import trace_id_of

AccessLine = dict[str, Any]  # the shape above: JSON, for `streamlab trace --json`


def shaped(proxy: str, *, request_id: str | None, trace_id: str, status: Any, bytes_sent: Any,
           total_s: float, start: float | None = None, end: float | None = None,
           upstream_header_s: float | None = None,
           upstream_response_s: float | None = None) -> AccessLine:
    """The one shape, from a proxy's fields: start or end (unix s), whichever
    it logs, and its total time give the other."""
    if start is None and end:
        start = end - total_s
    elif end is None and start:
        end = start + total_s
    return {"proxy": proxy, "request_id": request_id or "", "trace_id": trace_id,
            "status": status, "bytes": bytes_sent, "start": start or None, "end": end or None,
            "request_time_s": total_s, "upstream_header_s": upstream_header_s,
            "upstream_response_s": upstream_response_s}


def number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def captured(value: Any) -> str:
    """A HAProxy capture: "-" when the header was absent."""
    return "" if value in (None, "", "-") else str(value)


def first(value: Any) -> str | None:
    """A header as Caddy logs it (a list of values) or as a plain value."""
    if isinstance(value, list):
        return str(value[0]) if value else None
    return str(value) if value else None


def trace_of(value: Any) -> str:
    """The trace id of a `traceparent` (or `traceresponse`) value; "" if none."""
    return trace_id_of(str(value)) or "" if value else ""


def unix(value: Any) -> float | None:
    """Go's RFC 3339 time (nanoseconds) as unix seconds."""
    if not value:
        return None
    text = str(value)
    # fromisoformat takes microseconds at most.
    if "." in text:
        head, _, tail = text.partition(".")
        digits = "".join(c for c in tail if c.isdigit())
        zone = tail[len(digits):]
        text = f"{head}.{digits[:6]}{'+00:00' if zone in ('Z', '') else zone}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
