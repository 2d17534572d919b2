"""The scenario catalogue as one-click presets for the console page.

A preset is one scenario in one mode, turned into what a browser can do with
it: the toxics to set (the setup's own, applied as the runner applies them),
the nginx location and `streamlab` request options the page's streams use,
which transports show the scenario best, and, for scenarios whose fault
lands mid-stream (the engine hop, the resume cut), the fault the page applies
itself after a few tokens. Pure data from the scenario registry and each
scenario's declared ClientSettings: a new scenario becomes a preset with no
change here (its streams default to both SSE transports).
"""

from __future__ import annotations

from typing import Any

from streamlab.experiments.scenarios import (
    MODES,
    THINK_AFTER_TOKEN,
    Mode,
    Scenario,
    Setup,
    Timing,
    registry,
)
from streamlab.lab.toxiproxy import Toxic

# The page's transports (static/console.js has one driver per name).
TRANSPORTS = ("eventsource", "sse-fetch", "websocket", "long-poll", "poll")

# Which transports show each measure's failure; one not listed gets both SSE ones.
MEASURE_TRANSPORTS: dict[str, tuple[str, ...]] = {
    "sse_stream": ("sse-fetch",),
    "sliced_reads": ("sse-fetch",),
    "websocket_chat": ("websocket",),
    "abandoned_tab": ("sse-fetch",),
    "abandoned_prefill": ("sse-fetch",),
    "slow_reader": ("sse-fetch",),
    "slow_reader_edge": ("sse-fetch",),
    "abandoned_job": ("long-poll", "poll"),
    "engine_fault": ("sse-fetch",),
}
DEFAULT_TRANSPORTS = ("eventsource", "sse-fetch")

# The engine-hop faults of streamlab/experiments/scenarios/engine_faults.py (FAULTS), as
# toxics the page adds through the control API, or the hop disabled.
ENGINE_FAULT_TOXICS: dict[str, tuple[Toxic, ...]] = {
    "reset_peer": (Toxic("reset_peer", {"timeout": 0}),),
    "limit_data": (Toxic("limit_data", {"bytes": 1}),),
    "disabled": (),
    "timeout": (Toxic("timeout", {"timeout": 0}, "downstream"),
                Toxic("timeout", {"timeout": 0}, "upstream")),
}
# The resume cut: the hop goes down for this long after a few tokens, then the
# browser's EventSource (or nobody, in the broken mode) comes back.
RESUME_CUT_AFTER, RESUME_CUT_MS = 5, 1000
# Scenarios whose client walks away (ClientSettings.leave_after_tokens) leave
# the Stop button to the user, to press after that many tokens (0: in the
# silent prefill). A stream that is to be stopped mid-answer and whose measure
# picks no length is made long enough for a person to press Stop in time (the
# measure's own client is faster).
PRESS_STOP_TOKENS = 100
# Request options the gateway takes from a setup's knobs (docs/api.md).
REQUEST_KNOBS = ("relay", "engine_errors", "job_ttl_s")


def request_options(scenario: Scenario, setup: Setup, timing: Timing) -> dict[str, Any]:
    """The `streamlab` field of the page's requests: model pace, pauses,
    heartbeat and the broken-mode knobs the setup asks for."""
    options: dict[str, Any] = {**timing.fake_model()}
    client = scenario.client
    # The answer length the scenario's own client uses, where it picks one:
    # long enough that the fault (or the TTL) lands before the answer ends.
    tokens = client.tokens(timing)
    if tokens is not None:
        options["answer_tokens"] = tokens
    elif client.leave_after_tokens:
        options["answer_tokens"] = PRESS_STOP_TOKENS
    if client.prefill_ms is not None:
        options["prefill_ms"] = client.prefill_ms
    if client.silent_prefill:
        # Silent as the measure makes it: a `: ping` is a write, and a failed
        # write is what the broken nginx would notice the client's leaving by.
        options["heartbeat_s"] = 0
    if setup.think_pause:
        options["pauses"] = [{"after_token": THINK_AFTER_TOKEN,
                              "pause_ms": round(timing.think_s * 1000)}]
    if setup.heartbeat == "off":
        options["heartbeat_s"] = 0
    elif setup.heartbeat == "on":
        options["heartbeat_s"] = timing.heartbeat_s
    options.update({k: setup.knobs[k] for k in REQUEST_KNOBS if k in setup.knobs})
    return options


def mid_stream_fault(scenario: Scenario, setup: Setup) -> dict[str, Any] | None:
    """What the page does to a hop once its first stream has seen a few tokens."""
    knobs = setup.knobs
    fault = knobs.get("fault")
    after = scenario.client.fault_after_tokens
    if isinstance(fault, str) and fault in ENGINE_FAULT_TOXICS and after is not None:
        return {"hop": "engine", "after_tokens": after, "disable": fault == "disabled",
                "toxics": [t.as_json() for t in ENGINE_FAULT_TOXICS[fault]],
                "restore_after_ms": None}
    hop = knobs.get("hop")
    if scenario.measure.__name__ == "resume_cut" and isinstance(hop, str):
        return {"hop": hop, "after_tokens": RESUME_CUT_AFTER, "disable": True, "toxics": [],
                "restore_after_ms": RESUME_CUT_MS}
    return None


def transports(scenario: Scenario, setup: Setup) -> tuple[str, ...]:
    if scenario.measure.__name__ == "resume_cut":
        # Fixed: the browser's EventSource on the resume surface; broken: a
        # fetch on the OpenAI route, which has nothing to resume from.
        return ("eventsource",) if setup.knobs.get("resume") else ("sse-fetch",)
    return MEASURE_TRANSPORTS.get(scenario.measure.__name__, DEFAULT_TRANSPORTS)


def preset(scenario: Scenario, mode: Mode, timing: Timing) -> dict[str, Any]:
    variant = scenario.variant(mode)
    setup = variant.setup
    return {
        "scenario": scenario.name, "mode": mode, "summary": scenario.summary,
        "story": variant.story,
        "toxics": [{"hop": hop, **toxic.as_json()} for hop, toxic in setup.toxics],
        "location": setup.location,
        "streamlab": request_options(scenario, setup, timing),
        "transports": list(transports(scenario, setup)),
        "fault": mid_stream_fault(scenario, setup),
        "press_stop": scenario.client.leave_after_tokens is not None,
        "stop_after_tokens": scenario.client.leave_after_tokens,
        # The fetch stream's read timeout, where the setup gives the client one.
        "watchdog_s": timing.watchdog_s if setup.watchdog else None,
        # A setup whose client may wait forever: how long to watch it not end
        # (as the scenario's harness does: three watchdog periods past the end).
        "patience_s": (round(timing.model_total_s + 3 * timing.watchdog_s, 3)
                       if setup.patience == "short" else None),
        "expect": [check.describe(timing) for check in variant.expect],
    }


def presets(timing: Timing | None = None) -> list[dict[str, Any]]:
    """Every scenario of the catalogue, broken then fixed."""
    timing = timing or Timing()
    return [preset(scenario, mode, timing) for scenario in registry.all_scenarios()
            for mode in MODES]


def setup_of(name: str, mode: Mode) -> Setup:
    """The setup a preset applies; KeyError names an unknown scenario."""
    return registry.get(name).variant(mode).setup
