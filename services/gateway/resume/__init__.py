"""The resume surface's store (/v1/streams): one interface, two stores.

    store.py          ResumeStore, the one interface the resume routes use,
                      and FoundStream, what `find` answers
    ports.py          what the package needs from the gateway (Lease, Gateway),
                      handed in: it never imports state.py or lease.py
    streams.py        ResumableStream and StreamRegistry: a generation
                      decoupled from its connections
    replay_log.py     the bounded log of one stream's events, and its event ids
    memory.py         MemoryStore: this gateway's own registry (the default)
    redis_store.py    RedisStore: the log shared by every replica in Redis,
      ├── redis_keys.py     the key layout and a stream's meta
      ├── redis_log.py      the owner's writer of its log (retries, metrics)
      ├── redis_tail.py     a reader on a replica that does not own the stream
      └── redis_control.py  the replicas' control channel (cancel, hand-over)

`build_store` picks one from the settings; the app (state.py) holds it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.gateway.resume.memory import MemoryStore
from services.gateway.resume.store import FoundStream, ResumeStore
from services.gateway.settings import GatewaySettings

__all__ = ["FoundStream", "MemoryStore", "ResumeStore", "build_store"]


def build_store(settings: GatewaySettings, metrics: CollectorRegistry) -> ResumeStore:
    if settings.resume_store == "redis":
        # Imported only when chosen: the memory default never loads redis-py.
        from services.gateway.resume.redis_store import RedisStore
        return RedisStore(settings, metrics)
    return MemoryStore(settings, metrics)
