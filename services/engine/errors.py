"""Everything the engine raises on purpose, under one root, with the gRPC
status a caller gets for it (servicer.py aborts the call with it).

    EngineException            the root: catch it to catch any of them
      ├── InvalidRequest       INVALID_ARGUMENT: a wire request the engine refuses;
      │                        the message names the field (also a ValueError;
      │                        backends/base.py)
      ├── BackendError         .status (INTERNAL unless the backend says), .code:
      │                        a failure inside the model; the status before the
      │                        first token, "code: message" as its details
      │                        (backends/base.py)
      ├── AttachRefused        .status (NOT_FOUND, FAILED_PRECONDITION, ...): an
      │                        Attach that cannot be served (detached.py)
      ├── Replaced             ABORTED: a newer Attach took the generation over
      │                        (detached.py)
      ├── Stopped              CANCELLED: an explicit Cancel, the grace expiry or
      │                        the engine's shutdown stopped it (detached.py)
      ├── Refused              .status (a grpc.StatusCode): the status one call
      │                        ends with, whichever wire carries it (session.py)
      └── at start-up, no call to answer: the process exits with the message
          ├── BackendUnavailable  the configured backend cannot start (also a
          │                       RuntimeError; server.py)
          ├── ModelLoadError      the model or tokenizer could not be loaded (also
          │                       a RuntimeError; backends/hf.py)
          └── CannotListen        a port is taken or not ours (also an OSError;
                                  server.py)

Each stays in the module that raises it; only the root lives here, so a
backend needs nothing but this module (no grpc import: statuses are named).
"""

from __future__ import annotations


class EngineException(Exception):
    """The root of every exception the engine raises on purpose (the tree above)."""
