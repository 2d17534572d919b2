"""The one place scenarios are declared into: each family module calls
`register(Scenario(...))` beside its measure, and the registry imports the
families in one fixed order, so `scenario list` (and `scenario run all`) keep
their order whoever imports what first.

    register(*scenarios)   a family module declares its scenarios (at import)
    all_scenarios()        every scenario, in catalogue order
    get(name)              one scenario; KeyError names the known ones
    names()                the names, in catalogue order

The families load on the first lookup, not when this module is imported: the
CLI pays for the measures' imports only when it needs a scenario.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlab.experiments.scenarios.model import Scenario

# The catalogue order: a family module may import helpers only from a family
# listed before it (engine_faults uses lifecycle's), or its scenarios would
# register before that family's.
FAMILIES = (
    "catalogue",  # the proxy and client scenarios, whose measures are in measures.py
    "lifecycle",
    "edge_backpressure",
    "resume",
    "engine_faults",
    "seventh_tab",
    "h2_shared_fate",
    "reconnect_storm",
    "store_faults",
    "rolling_deploy",
    "replica_loss",
    "responses_resume",
    "transient_trouble",
    "store_outages",
)

_PACKAGE = "streamlab.experiments.scenarios."
# name -> (family index, scenario): kept apart from the import order, since a
# caller may import one family module (and, through it, another) before any lookup.
_SCENARIOS: dict[str, tuple[int, Scenario]] = {}
_loaded = False


def register(*scenarios: Scenario) -> None:
    """Declare scenarios, from a family module listed in FAMILIES, in the order
    given. A name declared twice is a mistake in a family module, not a redefinition."""
    module = sys._getframe(1).f_globals["__name__"]
    family = module.removeprefix(_PACKAGE)
    if family not in FAMILIES:
        raise ValueError(f"{module} is not a scenario family (add it to FAMILIES)")
    for scenario in scenarios:
        if scenario.name in _SCENARIOS:
            raise ValueError(f"scenario {scenario.name!r} is declared twice")
        _SCENARIOS[scenario.name] = (FAMILIES.index(family), scenario)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True  # before the imports: a family importing another must not recurse
    for family in FAMILIES:
        importlib.import_module(f"streamlab.experiments.scenarios.{family}")


def all_scenarios() -> tuple[Scenario, ...]:
    _load()
    # A stable sort: families in FAMILIES order, each in its own declaration order.
    return tuple(s for _, s in sorted(_SCENARIOS.values(), key=lambda entry: entry[0]))


def names() -> tuple[str, ...]:
    return tuple(s.name for s in all_scenarios())


def get(name: str) -> Scenario:
    _load()
    if name not in _SCENARIOS:
        raise KeyError(f"no scenario {name!r}; one of: {', '.join(names())}")
    return _SCENARIOS[name][1]
