"""The registry: every scenario declared once, beside its measure, listed in
one fixed order whatever was imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamlab.experiments.scenarios import registry
from streamlab.experiments.scenarios.model import ClientSettings

# The catalogue's order, as `scenario list` has always shown it: a change here
# is a change users and `scenario run all --seed S` replays would see.
ORDER = (
    "buffering", "buffering-header", "gzip", "idle-cut", "client-watchdog",
    "websocket-upgrade", "slicer", "latency-edge", "latency-upstream", "latency-engine",
    "bandwidth", "abandoned-tab", "abandoned-prefill", "slow-reader", "poll-leak",
    "slow-reader-edge", "resume", "resume-upstream", "engine-reset", "engine-cut",
    "engine-down", "engine-blackhole", "seventh-tab", "h2-shared-fate", "reconnect-storm",
    "store-faults", "rolling-deploy", "replica-loss", "responses-resume",
    "owner-killed-storm", "transient-blip", "redis-restart", "store-partition",
)


def test_the_33_scenarios_in_catalogue_order() -> None:
    assert registry.names() == ORDER
    assert [s.name for s in registry.all_scenarios()] == list(ORDER)


def test_the_order_does_not_follow_which_family_was_imported_first() -> None:
    # A fresh interpreter that imports a late family (and, through it, an
    # earlier one) before anything asks the registry.
    code = ("import streamlab.experiments.scenarios.store_faults\n"
            "from streamlab.experiments.scenarios import registry\n"
            "print(','.join(registry.names()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert tuple(out.split(",")) == ORDER


def test_a_name_declared_twice_is_refused() -> None:
    # As if catalogue.py declared idle-cut a second time.
    family = {"__name__": "streamlab.experiments.scenarios.catalogue",
              "register": registry.register, "scenario": registry.get("idle-cut")}
    with pytest.raises(ValueError, match="'idle-cut' is declared twice"):
        exec("register(scenario)", family)
    assert registry.names() == ORDER


def test_only_a_listed_family_may_declare() -> None:
    # This test module is no family: a scenario declared here would have no place
    # in the order.
    with pytest.raises(ValueError, match="not a scenario family"):
        registry.register(registry.get("idle-cut"))


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="no scenario 'nope'; one of: buffering, "):
        registry.get("nope")


def test_scenarios_whose_client_walks_away_or_faults_declare_when() -> None:
    # What the console's presets replay, declared with the scenario.
    client = {s.name: s.client for s in registry.all_scenarios()}
    assert client["abandoned-tab"].leave_after_tokens == 3
    assert client["abandoned-prefill"] == ClientSettings(
        prefill_ms=3000, silent_prefill=True, leave_after_tokens=0)
    assert all(client[name].fault_after_tokens == 3 for name in
               ("engine-reset", "engine-cut", "engine-down", "engine-blackhole"))
    assert client["buffering"] == ClientSettings()
