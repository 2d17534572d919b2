"""Each edge proxy where nginx stands: client → edge → PROXY → upstream → gateway.

One private lab per proxy on free ports (`--proxy NAME`), a case per proxy,
skipped with the reason when its binary is not installed
(scripts/install_proxies.sh). What each proxy does out of the box is measured
here, and docs/proxies.md reports it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.nginx import NginxOptions
from streamlab.lab.processes import StartError
from streamlab.lab.proxies import PROXY_NAMES, ProxyNotInstalled, edge_proxy
from streamlab.lab.proxies.idle import cuts_streams, fill
from tests.integration.conftest import TEST_ENGINE_ENV, TEST_GATEWAY_ENV, free_lab_ports
from tests.wait import wait_until_async

pytestmark = [
    pytest.mark.integration, pytest.mark.anyio,
    pytest.mark.local_only("each case starts a local lab of its own with another proxy"),
]

PREFILL_MS, GAP_MS, TOKENS = 300, 50, 20
# The idle timeouts here: /short-timeout/'s, and the one of the user configs
# below; the model's pause is longer than both.
SHORT_TIMEOUT_S, PAUSE_S = 1.0, 2.5
# Pings well within the short timeout, for the stream that must survive.
HEARTBEAT_S = 0.3

# What each proxy does at `/buffered/` (its out-of-the-box behaviour), as
# measured by test_out_of_the_box_location: True where the stream arrives as
# one lump at the end. nginx's defaults buffer (and gzip); HAProxy streams
# (it never buffers a response); Caddy and Traefik stream because Go's reverse
# proxy flushes a text/event-stream answer at once.
BUFFERS_OUT_OF_THE_BOX = {"nginx": True, "haproxy": False, "caddy": False, "traefik": False}
# Traefik has no idle timeout on an answer being streamed (docs/proxies.md).
NO_IDLE_TIMEOUT = {"traefik": "Traefik has no idle timeout on a streamed answer: the "
                              "entrypoint's writeTimeout is a deadline for the whole answer"}

# A user's own config per proxy, in that proxy's placeholder style, whose idle
# timeout (1 s) is shorter than the model's pause.
USER_CONFIGS = {
    "nginx": """
daemon off;
pid nginx.pid;
events {}
http {
  access_log off;
  client_body_temp_path tmp;
  proxy_temp_path tmp;
  server {
    listen ${STREAMLAB_LISTEN};
    location / {
      proxy_pass http://${STREAMLAB_UPSTREAM};
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_read_timeout 1s;
    }
  }
}
""",
    "haproxy": """
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 1s
frontend mine
  bind "${STREAMLAB_LISTEN}"
  default_backend app
backend app
  server app "${STREAMLAB_UPSTREAM}"
""",
    "caddy": """
{
\tadmin unix/{$STREAMLAB_RUN_DIR}/admin.sock
\tauto_https off
}
http://{$STREAMLAB_LISTEN} {
\treverse_proxy {$STREAMLAB_UPSTREAM} {
\t\ttransport http {
\t\t\tread_timeout 1s
\t\t}
\t}
}
""",
    "traefik": """
http:
  routers:
    mine:
      rule: "PathPrefix(`/`)"
      service: app
  services:
    app:
      loadBalancer:
        servers:
          - url: 'http://{{ env "STREAMLAB_UPSTREAM" }}'
""",
}
# The directive each user config above names for its idle timeout.
IDLE_DIRECTIVE = {"nginx": "proxy_read_timeout", "haproxy": "timeout server",
                  "caddy": "read_timeout"}
# An edit to each user config above that adds a response header, to see a
# reload take the edited file: (what to find, what to put there).
RELOAD_EDITS = {
    "nginx": ("proxy_read_timeout 1s;",
              "proxy_read_timeout 1s;\n      add_header X-Reloaded yes always;"),
    "haproxy": ("backend app\n", "backend app\n  http-response set-header X-Reloaded yes\n"),
    "caddy": ("\treverse_proxy", "\theader X-Reloaded yes\n\treverse_proxy"),
    "traefik": ("      service: app\n",
                "      service: app\n      middlewares: [reloaded]\n  middlewares:\n"
                "    reloaded:\n      headers:\n        customResponseHeaders:\n"
                "          X-Reloaded: \"yes\"\n"),
}
# A config each proxy refuses, and a phrase of the proxy's own refusal.
BAD_CONFIGS = {
    "nginx": ("events {}\nhttp { server { listen ${STREAMLAB_LISTEN}; "
              "location / { proxy_buffering maybe; } } }\n", "proxy_buffering"),
    "haproxy": ("defaults\n  mode http\n  timeout sever 1s\n", "timeout"),
    "caddy": ("http://{$STREAMLAB_LISTEN} {\n\treverse_proxy {$STREAMLAB_UPSTREAM} {\n"
              "\t\tflush_interval soon\n\t}\n}\n", "soon"),
    "traefik": ("http:\n  routers:\n    mine:\n      rule: \"PathPrefix(`/`)\"\n"
                "      service: nowhere\n", "nowhere"),
}


def require_installed(name: str) -> None:
    try:
        edge_proxy(name).find()
    except ProxyNotInstalled as exc:
        pytest.skip(str(exc))


def start_lab(run_dir: Path, name: str, user_config: str | None = None) -> Lab:
    config = None
    if user_config is not None:
        config = run_dir / f"user-{name}.conf"
        run_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(user_config)
    lab = Lab(free_lab_ports(), LabOptions(
        run_dir=run_dir, engine_env=dict(TEST_ENGINE_ENV), gateway_env=dict(TEST_GATEWAY_ENV),
        nginx=NginxOptions(short_read_timeout_s=SHORT_TIMEOUT_S), console=False,
        proxy=name, proxy_config=config))
    lab.up()  # stops what it started if it fails
    return lab


@pytest.fixture(scope="module", params=PROXY_NAMES)
def proxy_lab(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    name: str = request.param
    require_installed(name)
    lab = start_lab(tmp_path_factory.mktemp(f"lab-{name}"), name)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # The read timeout is every test's watchdog: no test can hang on a stream.
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


def completions(base: str, location: str = "/") -> str:
    return f"{base}{location.rstrip('/')}/v1/chat/completions"


async def paused_chat(http: httpx.AsyncClient, url: str, heartbeat_s: float) -> StreamResult:
    """A stream silent for PAUSE_S after its first token; heartbeat_s 0: no pings."""
    body = chat_body("think", prefill_ms=50, token_gap_ms=GAP_MS, answer_tokens=5,
                     pauses=[{"after_token": 1, "pause_ms": int(PAUSE_S * 1000)}],
                     heartbeat_s=heartbeat_s)
    return await stream_chat(http, url, body)


def streamed(result: StreamResult) -> bool:
    """Tokens spread over the generation, the first well before the last."""
    assert result.ttft_s is not None
    assert len(result.token_times) == TOKENS
    return (result.ttft_s < 0.5 * result.total_s
            and result.token_times[-1] - result.token_times[0] > 0.5 * result.total_s)


async def test_the_lab_says_which_proxy_stands_at_its_edge(proxy_lab: Lab) -> None:
    assert proxy_lab.edge_proxy == proxy_lab.options.proxy
    status = proxy_lab.status()
    assert status["nginx"]["proxy"] == proxy_lab.edge_proxy
    assert status["nginx"]["healthy"]
    assert status["edge"]["healthy"]
    # Another process attached to it (`streamlab status`) says the same.
    assert Lab.attach(proxy_lab.run_dir).edge_proxy == proxy_lab.edge_proxy


async def test_streaming_location_passes_tokens_one_by_one(
    proxy_lab: Lab, http: httpx.AsyncClient
) -> None:
    body = chat_body("hello", prefill_ms=PREFILL_MS, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    result = await stream_chat(http, completions(proxy_lab.edge_url), body,
                               headers={"Accept-Encoding": "gzip"})
    assert result.status == 200, result.error
    assert result.done
    assert result.error is None
    assert streamed(result), (result.ttft_s, result.token_times, result.total_s)


async def test_any_host_name_reaches_the_gateway(proxy_lab: Lab, http: httpx.AsyncClient) -> None:
    """A client that names the lab `localhost` (or any other name) is proxied
    like one that names 127.0.0.1: a host in a proxy's listen address must not
    turn into a Host matcher (Caddy's site address did: an empty 200)."""
    port = proxy_lab.edge_url.rsplit(":", 1)[1]
    response = await http.get(f"{proxy_lab.edge_url}/v1/models",
                              headers={"Host": f"localhost:{port}"})
    assert response.status_code == 200, response.text
    assert response.json()["data"], response.text


async def assert_out_of_the_box(http: httpx.AsyncClient, edge_url: str, proxy: str) -> None:
    """`/buffered/` holds the stream back as this proxy does out of the box
    (BUFFERS_OUT_OF_THE_BOX), or streams it; the compose lab's test asks too."""
    body = chat_body("hello", prefill_ms=PREFILL_MS, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    result = await stream_chat(http, completions(edge_url, "/buffered/"), body,
                               headers={"Accept-Encoding": "gzip"})
    assert result.done, result.error
    assert len(result.texts) == TOKENS
    assert result.first_byte_s is not None
    lump = (result.first_byte_s >= 0.9 * result.total_s
            and result.token_times[-1] - result.token_times[0] < 0.1 * result.total_s)
    assert lump == BUFFERS_OUT_OF_THE_BOX[proxy], (
        f"{proxy} /buffered/: first byte at {result.first_byte_s:.2f} s "
        f"of {result.total_s:.2f} s; tokens at {result.token_times}")
    if not lump:
        assert streamed(result)


async def test_out_of_the_box_location(proxy_lab: Lab, http: httpx.AsyncClient) -> None:
    """`/buffered/`: the proxy with its defaults. Whether it holds the stream
    back is measured, per proxy (BUFFERS_OUT_OF_THE_BOX)."""
    await assert_out_of_the_box(http, proxy_lab.edge_url, proxy_lab.edge_proxy)


@pytest.mark.parametrize("heartbeat_s", [0.0, HEARTBEAT_S], ids=["silent", "heartbeats"])
async def test_short_idle_timeout_cuts_a_silent_stream_only(
    proxy_lab: Lab, http: httpx.AsyncClient, heartbeat_s: float
) -> None:
    """`/short-timeout/`: the proxy's own idle timeout at SHORT_TIMEOUT_S cuts a
    stream silent for longer, and heartbeats keep it."""
    if proxy_lab.edge_proxy in NO_IDLE_TIMEOUT:
        pytest.skip(NO_IDLE_TIMEOUT[proxy_lab.edge_proxy])
    result = await paused_chat(http, completions(proxy_lab.edge_url, "/short-timeout/"),
                               heartbeat_s)
    if heartbeat_s:
        assert result.done
        assert result.error is None
        assert len(result.texts) == 5
    else:
        assert not result.done, "a stream silent past the idle timeout must be cut"
        assert 1 <= len(result.texts) < 5
        # Cut by the timeout, within the pause, not at its end.
        assert result.total_s < PAUSE_S


@pytest.mark.parametrize("name", PROXY_NAMES)
async def test_user_config_runs_in_the_chain_names_its_idle_timeout_and_reloads(
    name: str, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """`--proxy-config`: the user's file, placeholders filled in, serves the
    chain; its idle timeout shorter than the model's pause cuts a silent
    stream, and the lab's check names the directive that does; an edit to
    the file is taken by a reload."""
    require_installed(name)
    lab = start_lab(tmp_path / "lab", name, USER_CONFIGS[name])
    try:
        assert lab.edge_proxy == name
        assert lab.status()["edge"]["healthy"]
        text = fill(USER_CONFIGS[name], lab.proxy.environment(lab.proxy_setup))
        cutting = cuts_streams(name, text, PAUSE_S)
        result = await paused_chat(http, completions(lab.edge_url), 0.0)
        if name in NO_IDLE_TIMEOUT:
            assert cutting == []
            assert result.done, result.error
        else:
            assert [t.directive for t in cutting] == [IDLE_DIRECTIVE[name]]
            assert cutting[0].seconds == 1.0
            assert not result.done
            assert 1 <= len(result.texts) < 5
            # With pings more often than the timeout, the same config keeps it.
            kept = await paused_chat(http, completions(lab.edge_url), HEARTBEAT_S)
            assert kept.done
            assert kept.error is None
        await reload_takes_the_edited_file(lab, http)
    finally:
        lab.down()


async def reload_takes_the_edited_file(lab: Lab, http: httpx.AsyncClient) -> None:
    """The user edits the file; `reload_proxy` makes the running proxy (the
    same process) take it: its answers carry the header the edit added."""
    config = lab.options.proxy_config
    assert config is not None
    pid = lab.pids["nginx"]
    readyz = f"{lab.edge_url}/readyz"
    assert "x-reloaded" not in (await http.get(readyz)).headers
    old, new = RELOAD_EDITS[lab.edge_proxy]
    config.write_text(config.read_text().replace(old, new, 1))
    lab.reload_proxy()

    async def reloaded() -> bool:
        # Old workers may answer for a moment (nginx, HAProxy: the reload is a
        # signal; Traefik: a file watch): a new connection each time.
        async with httpx.AsyncClient(timeout=5.0) as fresh:
            return bool((await fresh.get(readyz)).headers.get("x-reloaded") == "yes")

    await wait_until_async(reloaded, timeout_s=10.0, what=f"{lab.edge_proxy} reloaded")
    assert lab.pids["nginx"] == pid


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_a_config_the_proxy_refuses_is_a_clear_error(name: str, tmp_path: Path) -> None:
    """The proxy's own message, at once: not a readiness timeout."""
    require_installed(name)
    text, phrase = BAD_CONFIGS[name]
    started = time.monotonic()
    with pytest.raises(StartError) as refused:
        start_lab(tmp_path / "lab", name, text)
    message = str(refused.value)
    assert name in message, message
    assert phrase in message, message
    assert "was not ready within" not in message, message
    assert time.monotonic() - started < 30.0
