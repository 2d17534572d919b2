"""`streamlab scenario list --json`: the catalogue as data (no lab needed)."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from streamlab.cli import app
from streamlab.experiments.scenarios import MODES, Timing, get, names


def catalogue_json() -> list[dict[str, Any]]:
    result = CliRunner().invoke(app, ["scenario", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed: list[dict[str, Any]] = json.loads(result.output)
    return listed


def test_list_json_holds_every_scenario_with_both_modes_and_their_checks() -> None:
    listed = catalogue_json()

    assert [s["name"] for s in listed] == list(names())
    assert len(listed) == 33
    for entry in listed:
        scenario = get(entry["name"])
        assert entry["summary"] == scenario.summary
        assert entry["measure"] == scenario.measure.__name__
        assert set(entry["modes"]) == set(MODES)
        for mode in MODES:
            variant, shown = scenario.variant(mode), entry["modes"][mode]
            assert shown["story"] == variant.story
            assert [c["figure"] for c in shown["expect"]] == [c.figure for c in variant.expect]
            assert [(t["hop"], t["type"]) for t in shown["setup"]["toxics"]] == [
                (hop, toxic.type) for hop, toxic in variant.setup.toxics]


def test_a_bound_that_follows_the_timing_is_shown_at_the_default_timing() -> None:
    fixed = next(s for s in catalogue_json() if s["name"] == "buffering")["modes"]["fixed"]
    ttft = next(c for c in fixed["expect"] if c["figure"] == "ttft_s")
    timing = Timing()

    assert ttft["bound_follows_timing"] is True
    assert ttft["bound"] == timing.prefill_s + 2 * timing.gap_s + timing.tolerance_s


def test_resume_is_listed_like_any_other_scenario() -> None:
    resume = next(s for s in catalogue_json() if s["name"] == "resume")
    assert resume["modes"]["broken"]["setup"]["knobs"] == {"resume": False, "hop": "edge"}
    assert resume["modes"]["fixed"]["setup"]["knobs"] == {"resume": True, "hop": "edge"}


def test_list_json_names_what_each_scenario_needs_of_the_lab() -> None:
    needs = {s["name"]: s["needs"] for s in catalogue_json()}
    assert needs["idle-cut"] == ["logs"]
    assert needs["engine-cut"] == ["engine_record", "toggle_hops"]
    assert needs["buffering"] == []
