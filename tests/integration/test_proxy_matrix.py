"""The proxy matrix's probes (streamlab/experiments/scenarios/edge_probes.py)
against real labs: a representative slice, nginx and HAProxy x five fast
probes, each probe's checks shown failing on the proxy's out-of-the-box form
and holding on the streaming-ready one where the two differ (the checks
discriminate), a user config whose idle
timeout cuts a pause reported with its directive, and nginx's reload, cut by
a short hard stop and drained by the lab's config. `make proxy-matrix` runs
the whole matrix (docs/proxy-matrix.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.experiments.scenarios.edge_matrix import Matrix, ProxyRow, markdown, run_matrix
from streamlab.experiments.scenarios.edge_probes import get_probe
from streamlab.lab.proxies import ProxyNotInstalled, edge_proxy
from tests.integration.test_proxies import USER_CONFIGS

pytestmark = [
    pytest.mark.integration, pytest.mark.anyio,
    pytest.mark.local_only("each case starts a local lab of its own with another proxy"),
]

SLICE = ("compression", "websocket", "client-address", "idle-cut", "client-leaves")
# What each probe measures, per proxy, out of the box and streaming-ready
# (docs/proxy-matrix.md has the full run): True where the stream broke (the
# probe's checks did not hold: UNEXPECTED).
EXPECTED: dict[str, dict[str, tuple[bool, bool]]] = {
    "nginx": {"compression": (True, False), "websocket": (True, False),
              "client-address": (True, False), "idle-cut": (True, False),
              "client-leaves": (True, False)},
    # HAProxy's `/` has `option forwardfor` and `option abortonclose`, its
    # bare `/buffered/` neither.
    "haproxy": {"compression": (False, False), "websocket": (False, False),
                "client-address": (True, False), "idle-cut": (True, False),
                "client-leaves": (True, False)},
}


def require_installed(name: str) -> None:
    try:
        edge_proxy(name).find()
    except ProxyNotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
async def slice_matrix() -> Matrix:
    """Both proxies' labs, each up for its probes and down again (run_matrix)."""
    for name in EXPECTED:
        require_installed(name)
    return await run_matrix(list(EXPECTED), [get_probe(p) for p in SLICE],
                            say=lambda line: None)


def row(matrix: Matrix, proxy: str) -> ProxyRow:
    return next(r for r in matrix.rows if r.proxy == proxy)


@pytest.mark.parametrize("proxy", list(EXPECTED))
@pytest.mark.parametrize("probe", SLICE)
async def test_each_probe_breaks_where_the_proxy_does_and_not_where_it_is_fixed(
    slice_matrix: Matrix, proxy: str, probe: str
) -> None:
    measured = row(slice_matrix, proxy)
    assert not measured.error, measured.error
    cells = measured.cells[probe]
    broken = (not cells["default"].as_expected, not cells["ready"].as_expected)
    assert broken == EXPECTED[proxy][probe], (probe, proxy, cells)
    # The ready form carries the checks judged out of the box: they discriminate there.
    assert cells["ready"].discriminates == EXPECTED[proxy][probe][0]


async def test_the_slice_is_measured_and_renders(slice_matrix: Matrix) -> None:
    assert slice_matrix.measured
    assert slice_matrix.undiscriminating == []
    text = markdown(slice_matrix)
    assert text.count("### ") == len(SLICE)
    # nginx's gzip lump, with the directive that fixes it.
    assert "| nginx | UNEXPECTED (content_encoding gzip" in text


async def test_a_user_config_whose_idle_timeout_is_shorter_than_the_pause_is_named(
    tmp_path: Path,
) -> None:
    """The user's HAProxy config, `timeout server 1s`: the idle-cut probe
    pauses longer than that, silent, and reports the cut with the directive."""
    require_installed("haproxy")
    config = tmp_path / "mine.cfg"
    # test_proxies.py's own HAProxy config (its first line at line 1).
    config.write_text(USER_CONFIGS["haproxy"].lstrip("\n"))
    matrix = await run_matrix(["haproxy"], [get_probe("idle-cut")], user_config=config,
                              say=lambda line: None)
    cell = matrix.rows[0].cells["idle-cut"]["yours"]
    assert cell.verdict == "UNEXPECTED", cell
    assert cell.figures["pause_s"] == 2.0
    assert "`timeout server` 1 s (line 5)" in cell.story
    assert matrix.yours_broken
    # The same config with a timeout longer than the pause keeps the stream.
    config.write_text(config.read_text().replace("timeout server 1s", "timeout server 30s"))
    matrix = await run_matrix(["haproxy"], [get_probe("idle-cut")], user_config=config,
                              say=lambda line: None)
    assert matrix.rows[0].cells["idle-cut"]["yours"].as_expected


async def test_a_reload_with_a_short_hard_stop_cuts_the_streams_the_lab_config_drains() -> None:
    """nginx's reload probe: the lab's config (worker_shutdown_timeout 30s)
    keeps every live stream across `kill -HUP`; the same reload with the bound
    at 1 s, its broken form, cuts them all; the config is restored after."""
    require_installed("nginx")
    matrix = await run_matrix(["nginx"], [get_probe("reload")], say=lambda line: None)
    ready = matrix.rows[0].cells["reload"]["ready"]
    assert ready.as_expected, ready
    assert ready.figures["whole"] == ready.figures["streams"]
    assert ready.figures["hard_stop_1s_cut"] == ready.figures["streams"]
    # nginx's own default (no bound) drains as well: the old worker goes as the streams end.
    default = matrix.rows[0].cells["reload"]["default"]
    assert default.as_expected, default
    assert default.figures["old_workers_gone_after_s"] is not None
