"""Everything the lab tool raises on purpose, under one root.

    StreamlabError              the root: catch it to catch any of them
      ├── bringing a lab up and reaching it (streamlab/lab/)
      │   ├── StartError            a lab process did not start or get ready
      │   │                         (also a RuntimeError; processes.py)
      │   │   ├── ProxyConfigError  the edge proxy refused its config, quoted
      │   │   │                     (proxies/base.py)
      │   │   └── ProxyNotInstalled the chosen edge proxy is missing (also a
      │   │                         FileNotFoundError; proxies/base.py)
      │   ├── ComposeError          `docker compose` failed (also a RuntimeError;
      │   │                         compose.py)
      │   ├── ConfigDrift           a committed compose file differs from what
      │   │                         `streamlab compose config` generates (compose_config.py)
      │   ├── BackendChoiceError    an engine backend option is missing or wrong
      │   │                         (also a ValueError; engine_backend.py)
      │   ├── TargetUnreachable     the lab (its Toxiproxy) or a checked server does not
      │   │                         answer: exit status 3 (also a RuntimeError; target.py)
      │   ├── MissingCapability     an experiment needs a capability this lab lacks
      │   │                         (pids, logs, ...; also a RuntimeError; target.py)
      │   ├── ToxiproxyError        Toxiproxy refused (.status_code) or was unreachable
      │   │                         (0); the console answers its status, else 502
      │   │                         (toxiproxy.py)
      │   ├── ToxicSpecError        a toxic Toxiproxy would not understand (also a
      │   │                         ValueError; the console answers 400; toxiproxy.py)
      │   ├── ToxiproxyNotFound     no toxiproxy-server where streamlab looks for one
      │   │                         (also a FileNotFoundError; streamlab/paths.py)
      │   ├── JaegerNotFound        no Jaeger binary for `streamlab up --tracing` (also a
      │   │                         FileNotFoundError; jaeger.py)
      │   ├── ToolMissing           `streamlab install toxiproxy` found no suitable Go
      │   │                         (or no patch, no git): exit 2 (also a RuntimeError;
      │   │                         toxiproxy_install.py)
      │   └── ToxiproxyBuildFailed  its download or build failed, quoting Go (also a
      │                             RuntimeError; toxiproxy_install.py)
      ├── running experiments (streamlab/experiments/)
      │   ├── ScenarioUnavailable   this lab or machine cannot run the scenario: the
      │   │                         tests skip with its reason (also a RuntimeError;
      │   │                         scenarios/model.py)
      │   ├── FloodTooLong          the engine caps answers below what a stalled reader
      │   │                         needs (also a RuntimeError; load_clients.py)
      │   ├── ReadersRefused        some requests of a bench never reached the engine
      │   │                         (also a RuntimeError; bench/slow_readers.py)
      │   ├── FloorError            the gRPC floor's bare processes did not run to the
      │   │                         end (also a RuntimeError; bench/setup_floor.py)
      │   ├── NoModel               `streamlab check` got no --model and the server's
      │   │                         /v1/models lists none: exit 2 (check/runner.py)
      │   └── BrowserError          the headless browser failed (browser.py)
      ├── the web console's control API (streamlab/console/control.py)
      │   ├── UnknownName           a hop, scenario or mode the lab lacks: 404 (also
      │   │                         a LookupError)
      │   ├── EngineUnreachable     GetStats failed: 503 (also a RuntimeError)
      │   └── TraceUnavailable      no traced local lab to draw a stream's waterfall
      │                             from: 409 (also a RuntimeError; console/trace.py)
      └── the commands (streamlab/commands/conventions.py)
          └── CommandFailed         a command gives up: its message on stderr (and in
                                    its --json document), its exit status (also
                                    click's ClickException)

Each stays in the module that raises it; the commands (streamlab/commands/)
turn them into a message and an exit status. The builtin base each had before
it got this root is kept, so every `except RuntimeError` still catches it.
"""

from __future__ import annotations


class StreamlabError(Exception):
    """The root of every exception the lab tool raises on purpose (the tree above)."""
