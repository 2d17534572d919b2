"""Scenarios as data: each failure of a token stream, broken and fixed, measured.

    model.py         Scenario, Variant, Setup, ClientSettings, Measured (the data types)
    registry.py      register / all_scenarios / get: the one way a scenario is declared
    catalogue.py     the proxy and client scenarios (their measures are in measures.py)
    measures.py      the measure functions of the proxy and client scenarios
    lifecycle.py     scenarios (and their measures) of a stream's life after the client
    edge_backpressure.py  a reader that stops reading at the edge: what each hop holds
    resume.py        the resume scenario: a cut stream, read without and with resume
    responses_resume.py  a cut background Responses stream, resumed with starting_after
    engine_faults.py scenarios of the gRPC hop failing mid-stream
    seventh_tab.py   seven browser tabs over HTTP/1.1 and HTTP/2 (a real chromium)
    h2_shared_fate.py one cut on an HTTP/2 connection hits every stream; resume
    reconnect_storm.py  the edge cut under hundreds of resumable streams
    store_faults.py  the resume store (Redis) slow or gone under live streams
    rolling_deploy.py restart 3 gateways one at a time under 200 resumable streams
    replica_loss.py  SIGKILL the gateway that owns a generation, mid-stream
    transient_trouble.py  a storm with the owner killed; store and engine-hop blips
    store_outages.py Redis restarted, one gateway cut from Redis (split brain)
    history.py       the one judge of resuming readers' events (exactly once, order,
                     no silent gap, an end), for the storms and the store outages
    replica_lab.py   a private lab with replicas, up and down around one run
    resuming_readers.py  cheap EventSource-like readers, hundreds at once
    runner.py        run(lab, scenario, mode, timing) -> Report, judged;
                     run_plan(lab, plan, timing) -> Report, with the skip/error policy

The time constants are streamlab/experiments/timing.py's Timing; a lab is any LabTarget.
"""

from streamlab.experiments.report import Check, Report
from streamlab.experiments.scenarios.model import (
    MODES,
    THINK_AFTER_TOKEN,
    ClientSettings,
    Measured,
    Mode,
    Scenario,
    ScenarioUnavailable,
    Setup,
    Timeline,
    Variant,
)
from streamlab.experiments.scenarios.registry import all_scenarios, get, names, register
from streamlab.experiments.scenarios.runner import (
    plan_runs,
    run,
    run_plan,
    timing_for,
)
from streamlab.experiments.timing import Timing
from streamlab.lab.target import TargetUnreachable

__all__ = ["MODES", "THINK_AFTER_TOKEN", "Check", "ClientSettings", "Measured", "Mode", "Report",
           "Scenario", "ScenarioUnavailable", "Setup", "TargetUnreachable", "Timeline",
           "Timing", "Variant", "all_scenarios", "get", "names", "plan_runs", "register", "run",
           "run_plan", "timing_for"]

