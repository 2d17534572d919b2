"""Scenarios as data: each failure of a token stream, broken and fixed, measured.

    model.py      Scenario, Variant, Setup, Check, Timing (the data types)
    catalogue.py  CATALOGUE: the scenarios themselves
    measures.py   the measure functions scenarios point at
    runner.py     run(lab, scenario, mode, timing) -> Outcome, with a verdict
"""

from streamlab.scenarios.catalogue import CATALOGUE
from streamlab.scenarios.model import MODES, Check, Mode, Scenario, Setup, Timing, Variant
from streamlab.scenarios.runner import Outcome, run, timing_for

__all__ = ["CATALOGUE", "MODES", "Check", "Mode", "Outcome", "Scenario", "Setup", "Timing",
           "Variant", "run", "timing_for"]
