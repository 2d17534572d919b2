"""Scenarios as data: each failure of a token stream, broken and fixed, measured.

    model.py         Scenario, Variant, Setup, Check (the data types)
    catalogue.py     CATALOGUE: the scenarios themselves
    measures.py      the measure functions of the proxy and client scenarios
    lifecycle.py     scenarios (and their measures) of a stream's life after the client
    resume.py        the resume scenario: a cut stream, read without and with resume
    engine_faults.py scenarios of the gRPC hop failing mid-stream
    seventh_tab.py   seven browser tabs over HTTP/1.1 and HTTP/2 (a real chromium)
    h2_shared_fate.py one cut on an HTTP/2 connection hits every stream; resume
    rolling_deploy.py restart 3 gateways one at a time under 200 resumable streams
    replica_loss.py  SIGKILL the gateway that owns a generation, mid-stream
    replica_lab.py   a private lab with replicas, up and down around one run
    resuming_readers.py  cheap EventSource-like readers, hundreds at once
    runner.py        run(lab, scenario, mode, timing) -> Outcome, with a verdict

The time constants are streamlab/experiments/timing.py's Timing; a lab is any LabTarget.
"""

from streamlab.experiments.report import Check
from streamlab.experiments.scenarios.catalogue import CATALOGUE
from streamlab.experiments.scenarios.model import MODES, Mode, Scenario, Setup, Variant
from streamlab.experiments.scenarios.runner import Outcome, run, timing_for
from streamlab.experiments.timing import Timing

__all__ = ["CATALOGUE", "MODES", "Check", "Mode", "Outcome", "Scenario", "Setup", "Timing",
           "Variant", "run", "timing_for"]
