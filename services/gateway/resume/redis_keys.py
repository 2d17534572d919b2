"""Where a resumable stream lives in Redis, and how its metadata is spelled.

Pure (no I/O), so it is unit-tested on its own. Every key of one stream shares
the `{<stream id>}` hash tag, so a Redis Cluster keeps them on one shard (a
pipeline of one stream's writes then stays valid there).

    <prefix>:{<id>}:events     Stream: one entry per event, entry id `0-<seq>`
                               (the event's sequence number, so `XREAD` after
                               `0-<n>` is exactly "after Last-Event-ID n"),
                               fields k (kind) and d (data); `XADD MAXLEN` =
                               the stream's max_events
    <prefix>:{<id>}:meta       Hash: owner (identity, "" for none), replica
                               (the gateway running the engine call), state,
                               cancel_reason, last_seq, grace_s, ttl_s,
                               retry_ms, max_events, created (unix s)
    <prefix>:{<id>}:followers  Sorted set: one member per reader on a replica
                               other than the owner, scored with the unix ms
                               its presence expires at
    <prefix>:{<id>}:attaches   List: the newest readers' attach records (JSON,
                               the status endpoint's `attaches`), from every
                               replica a reader came to; expires with meta
    <prefix>:{<id>}:readers    Sorted set: the readers connected now on any
                               replica (their attach record, JSON), scored
                               with the unix ms their presence expires at
                               (services/gateway/resume/record.py)
    <prefix>:{<id>}:gone       String: set when the stream ends, outlives the
                               rest by the tombstone time, so an expired id
                               answers 410 rather than 404
    <prefix>:replica:<replica> String (the process's incarnation id): present
                               while that replica runs
                               (refreshed every second, expires after
                               `ALIVE_TTL_S`): how a reader elsewhere learns
                               that the owner of its stream is gone
    <prefix>:owned:<replica>   Set: the ids of the streams that replica owns
                               (added at create or take-over, removed at the
                               end or a hand-off)
    <prefix>:replicas          Set: the replicas that have owned streams
    <prefix>:control:<replica> Pub/sub channel: JSON commands to the replica
                               that owns engine calls ({"op": "cancel", "id",
                               "reason"})

While the generation runs, events and meta expire `running_ttl_s` after the
last write (so a dead owner's streams vanish); once it ends, `ttl_s` after.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamlab_protocol.generation import GenerationState


@dataclass(frozen=True)
class StreamKeys:
    events: str
    meta: str
    followers: str
    gone: str
    attaches: str
    readers: str


def stream_keys(prefix: str, stream_id: str) -> StreamKeys:
    base = f"{prefix}:{{{stream_id}}}"
    return StreamKeys(f"{base}:events", f"{base}:meta", f"{base}:followers", f"{base}:gone",
                      f"{base}:attaches", f"{base}:readers")


ALIVE_TTL_S = 3.0
# A stream's meta `replica` once its owner handed it off (a drain): no
# replica's alive key has this name, so the next reader takes it over at once.
RELEASED = ""


def replica_key(prefix: str, replica: str) -> str:
    return f"{prefix}:replica:{replica}"


def owned_key(prefix: str, replica: str) -> str:
    """Set: the ids of the running streams this replica owns (what another
    replica takes over at once when this one's alive key is gone)."""
    return f"{prefix}:owned:{replica}"


def replicas_key(prefix: str) -> str:
    """Set: every replica that has owned streams (whose `owned` set to watch)."""
    return f"{prefix}:replicas"


def control_channel(prefix: str, replica: str) -> str:
    return f"{prefix}:control:{replica}"


def entry_id(seq: int) -> str:
    return f"0-{seq}"


def entry_seq(raw: str | bytes) -> int:
    """The sequence number of a Stream entry id `0-<seq>`."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    major, _, minor = text.partition("-")
    if major != "0" or not minor.isdigit():
        raise ValueError(f"not a resume log entry id: {text!r}")
    return int(minor)


@dataclass(frozen=True)
class StreamMeta:
    owner: str | None
    replica: str
    state: GenerationState
    cancel_reason: str | None
    last_seq: int
    grace_s: float
    ttl_s: float
    retry_ms: int
    max_events: int
    created: float
    # The owner's incarnation (a fresh id per process, the value of its alive
    # key): a replica restarted under the same name is not its old self, and
    # its alive key must not keep the streams its predecessor lost.
    incarnation: str = ""
    # Trouble that may pass, while it lasts (the owner re-attaching to its
    # generation): {"n", "code", "message"} as JSON, "" when none. Readers on
    # other replicas are told it as `event: retry`, as the owner's are.
    notice: str = ""
    # The owner's span of the stream (W3C traceparent; "" when tracing is
    # off): a replica that takes the stream over, by its sweep or for a
    # reader, parents its span on it, so the stream stays one trace.
    traceparent: str = ""

    @property
    def ended(self) -> bool:
        return self.state is not GenerationState.RUNNING

    def to_hash(self) -> dict[str, str]:
        return {"owner": self.owner or "", "replica": self.replica, "state": self.state.value,
                "cancel_reason": self.cancel_reason or "", "last_seq": str(self.last_seq),
                "grace_s": repr(self.grace_s), "ttl_s": repr(self.ttl_s),
                "retry_ms": str(self.retry_ms), "max_events": str(self.max_events),
                "created": repr(self.created), "incarnation": self.incarnation,
                "notice": self.notice, "traceparent": self.traceparent}

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes] | dict[str, str]) -> StreamMeta:
        """From HGETALL's answer; ValueError if a field is missing or bad."""
        fields = {(k.decode() if isinstance(k, bytes) else k):
                  (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
        try:
            return cls(owner=fields["owner"] or None, replica=fields["replica"],
                       state=GenerationState(fields["state"]),
                       cancel_reason=fields["cancel_reason"] or None,
                       last_seq=int(fields["last_seq"]), grace_s=float(fields["grace_s"]),
                       ttl_s=float(fields["ttl_s"]), retry_ms=int(fields["retry_ms"]),
                       max_events=int(fields["max_events"]), created=float(fields["created"]),
                       incarnation=fields.get("incarnation", ""),
                       notice=fields.get("notice", ""),
                       traceparent=fields.get("traceparent", ""))
        except KeyError as exc:
            raise ValueError(f"resume metadata lacks {exc.args[0]!r}") from exc
