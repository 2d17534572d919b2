"""streamlab's pytest plugin (the `pytest11` entry point `streamlab`): a lab
and its faults as fixtures, and `streamlab check` as tests.

Fixtures:

    streamlab_lab           the running lab from its run dir (--streamlab-run-dir,
                            default: the one `streamlab up` uses, streamlab/paths.py),
                            or one started for the session on free ports and
                            stopped at its end
    streamlab_edge_url      where clients connect: the whole chain
    streamlab_toxics        faults on a hop, undone when the block ends:
                                with streamlab_toxics.idle_cut("edge", seconds=2): ...
                                with streamlab_toxics.latency("engine", ms=300): ...
                                with streamlab_toxics.cut("gateway"): ...
    streamlab_engine_record the engine's record of one request (by its id)

Options:

    --streamlab-target URL  add the check suite (`streamlab check URL`) to the
                            session, one test per check: pass, fail with the
                            evidence, or skipped (n/a) with why; with
                            --streamlab-model M (default: the first /v1/models
                            lists), --streamlab-api-key-env VAR,
                            --streamlab-metrics-url URL (default: the root's
                            /metrics), --streamlab-extra-body JSON

Everything heavy (the lab, httpx, the checks) is imported when a fixture or
the suite is used, never when pytest loads the plugin: every pytest session
in an environment with streamlab installed loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from streamlab.experiments.report import Report
    from streamlab.lab.target import LabTarget
    from streamlab.lab.toxiproxy import ToxiproxyClient
    from streamlab_protocol.engine.v1 import engine_pb2 as pb


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamlab", "streamlab: a streaming lab and its checks")
    group.addoption("--streamlab-run-dir", default=None,
                    help="The run dir of a lab `streamlab up` started (default: the one "
                         "`streamlab up` uses: $STREAMLAB_STATE_DIR, a clone's .run or the "
                         "user's state directory); none there: the session starts one.")
    group.addoption("--streamlab-target", default=None, metavar="URL",
                    help="Run `streamlab check` against this OpenAI base URL as tests.")
    group.addoption("--streamlab-model", default=None,
                    help="The model the checks ask for (default: the first /v1/models lists).")
    group.addoption("--streamlab-api-key-env", default=None, metavar="VAR",
                    help="The environment variable holding the target's API key.")
    group.addoption("--streamlab-metrics-url", default=None, metavar="URL",
                    help="The target's Prometheus /metrics (default: the root's /metrics).")
    group.addoption("--streamlab-extra-body", default=None, metavar="JSON",
                    help="JSON merged into every request the checks send.")


# ---- the lab ---------------------------------------------------------------------

def lab_run_dir(config: pytest.Config) -> Path:
    """--streamlab-run-dir, else the run dir `streamlab up` uses (streamlab/paths.py)."""
    from streamlab.paths import run_dir

    given = config.getoption("--streamlab-run-dir")
    return Path(given) if given else run_dir()


@pytest.fixture(scope="session")
def streamlab_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[LabTarget]:
    """The lab from its run dir if one runs there, else one of the session's own."""
    from streamlab.lab.local import Lab, LabOptions
    from streamlab.lab.processes import free_ports
    from streamlab.lab.topology import Ports

    run_dir = lab_run_dir(request.config)
    if (run_dir / "state.json").exists():
        yield Lab.attach(run_dir)
        return
    names = [name for name in Ports.model_fields if name.endswith("_port")]
    ports = Ports.model_validate(
        {"host": "127.0.0.1", **dict(zip(names, free_ports(len(names)), strict=True))})
    lab = Lab(ports, LabOptions(run_dir=tmp_path_factory.mktemp("streamlab-lab")))
    lab.up()  # stops what it started if it fails
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def streamlab_edge_url(streamlab_lab: LabTarget) -> str:
    """Where clients connect (http://host:port, no /v1): every hop's faults on the way."""
    return streamlab_lab.edge_url


class Toxics:
    """Faults on the lab's hops (Toxiproxy), each undone when its block ends."""

    def __init__(self, client: ToxiproxyClient, lab: LabTarget | None = None) -> None:
        self.client = client
        self.lab = lab

    @contextlib.contextmanager
    def _toxic(self, hop: str, kind: str, attributes: dict[str, int | float]) -> Iterator[None]:
        from streamlab.lab.toxiproxy import Toxic

        toxic = Toxic(kind, attributes, name=f"plugin_{kind}")
        self.client.add_toxic(hop, toxic)
        try:
            yield
        finally:
            self.client.remove_toxic(hop, toxic.as_json()["name"])

    def latency(self, hop: str, ms: int, jitter_ms: int = 0
                ) -> contextlib.AbstractContextManager[None]:
        """Every chunk on the hop (server to client) waits `ms` more."""
        return self._toxic(hop, "latency", {"latency": ms, "jitter": jitter_ms})

    @contextlib.contextmanager
    def idle_cut(self, hop: str, seconds: float) -> Iterator[None]:
        """A true idle cut on the hop: a connection that carries no byte from
        the server for `seconds` is closed (both ways), as nginx's
        proxy_read_timeout or a load balancer's idle timeout does; one that
        keeps sending (tokens, `: ping` heartbeats) lives on. Toxiproxy has no
        such toxic (its `timeout` stops all data and closes after a fixed time,
        bytes or not), so the hop is pointed at `streamlab check`'s idle-cutting
        relay (experiments/check/hop.py), which forwards to the hop's upstream;
        repointing restarts the hop's listener, so its open connections close
        on entry and exit. The relay runs in this process: Toxiproxy must reach
        127.0.0.1 here (a local-process lab)."""
        from streamlab.experiments.check.hop import idle_cut_relay_thread
        from streamlab.lab.target import Capability, require

        if self.lab is not None:  # the relay must be where the lab's Toxiproxy runs
            require(self.lab, [Capability.PIDS], "streamlab_toxics.idle_cut")
        upstream = str(self.client.proxy(hop)["upstream"])
        host, _, port = upstream.rpartition(":")
        with idle_cut_relay_thread(host, int(port), seconds) as relay:
            self.client.set_upstream(hop, f"127.0.0.1:{relay}")
            try:
                yield
            finally:
                self.client.set_upstream(hop, upstream)

    @contextlib.contextmanager
    def cut(self, hop: str) -> Iterator[None]:
        """The hop off: its connections close and new ones are refused."""
        self.client.set_enabled(hop, False)
        try:
            yield
        finally:
            self.client.set_enabled(hop, True)


@pytest.fixture
def streamlab_toxics(streamlab_lab: LabTarget) -> Iterator[Toxics]:
    """Faults on the lab's hops as context managers: `idle_cut(hop, seconds=)`,
    `latency(hop, ms=)`, `cut(hop)`; each is undone when its block ends."""
    from streamlab.lab.target import Capability, require

    require(streamlab_lab, [Capability.TOGGLE_HOPS], "streamlab_toxics")
    client = streamlab_lab.toxiproxy()
    try:
        yield Toxics(client, streamlab_lab)
    finally:
        client.close()


@pytest.fixture
def streamlab_engine_record(streamlab_lab: LabTarget
                            ) -> Callable[[str], pb.GetStatsResponse]:
    """`streamlab_engine_record(request_id)`: the engines' counters and that
    request's record (send the id as the request's `streamlab.request_id`)."""
    from streamlab.lab.target import Capability, require

    require(streamlab_lab, [Capability.ENGINE_RECORD], "streamlab_engine_record")
    return streamlab_lab.engine_stats


# ---- `streamlab check` as tests -------------------------------------------------------

class CheckItem(pytest.Item):
    """One check of `streamlab check` against --streamlab-target; the checks
    run once per session (the first item runs them all) and each item reports
    its own."""

    def __init__(self, *, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        from streamlab.experiments.check.verdict import line, verdict

        part = next(p for p in _suite_report(self.config).parts if p.variant == self.check)
        shown = verdict(part)
        if shown == "n/a":
            pytest.skip(part.reason)
        if shown != "pass":
            # The check's line is the whole story (evidence and fix): no traceback.
            pytest.fail(line(part), pytrace=False)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "streamlab check", None, f"streamlab check: {self.check}"


_REPORTS = pytest.StashKey["Report"]()


def _suite_report(config: pytest.Config) -> Report:
    """The whole check run, once per session (asyncio.run: a sync test's thread
    has no loop running)."""
    if _REPORTS not in config.stash:
        from streamlab.experiments.check.runner import check_url
        from streamlab.experiments.check.target import CheckTarget

        key_env = config.getoption("--streamlab-api-key-env")
        target = CheckTarget(config.getoption("--streamlab-target"),
                             config.getoption("--streamlab-model") or "",
                             api_key=os.environ.get(key_env) if key_env else None,
                             metrics_url=config.getoption("--streamlab-metrics-url"),
                             extra_body=json.loads(config.getoption("--streamlab-extra-body")
                                                   or "{}"))
        config.stash[_REPORTS] = asyncio.run(check_url(target))
    return config.stash[_REPORTS]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if config.getoption("--streamlab-target") is None:
        return
    from streamlab.experiments.check.runner import CHECKS

    items.extend(CheckItem.from_parent(session, name=f"streamlab_check[{name}]", check=name)
                 for name in CHECKS)
