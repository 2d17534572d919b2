"""Each scenario run keeps its last report per mode with the streams it judged,
and `scenario show NAME --last` lists them with the `streamlab trace ID` that
opens each (issue 39, item 5). Against a FakeLab whose run dir is a tmp dir."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamlab.cli import app
from streamlab.experiments.report import Figures
from streamlab.experiments.scenarios import registry
from streamlab.experiments.scenarios.model import Setup, note_stream
from streamlab.experiments.scenarios.runner import artifacts_dir, last_run, run
from streamlab.experiments.timing import Timing
from streamlab.lab.fake import FakeLab
from streamlab.lab.local import LabOptions
from streamlab.lab.target import LabTarget


async def _judged(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    note_stream("extra-1")
    # A task the measure starts notes its stream into the same run.
    await asyncio.create_task(_note("extra-2"))
    return {"request_id": "main-1", "done": setup.heartbeat == "on", "error_code": "transport"}


async def _note(request_id: str) -> None:
    note_stream(request_id)


async def _crashes(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    note_stream("crashed-1")
    raise RuntimeError("the client fell over")


@pytest.mark.anyio
async def test_a_run_keeps_its_streams_and_show_last_lists_them(tmp_path: Path) -> None:
    lab = FakeLab(LabOptions(run_dir=tmp_path, tracing=True))
    scenario = replace(registry.get("idle-cut"), measure=_judged, needs=frozenset())
    broken = await run(lab, scenario, "broken", Timing())
    assert broken.figures["request_ids"] == "main-1,extra-1,extra-2"
    await run(lab, scenario, "fixed", Timing())

    kept = last_run(artifacts_dir(lab), "idle-cut")
    assert kept is not None
    assert kept["modes"]["broken"]["request_ids"] == ["main-1", "extra-1", "extra-2"]
    assert kept["modes"]["fixed"]["traced"] is True

    shown = CliRunner().invoke(app, ["scenario", "show", "idle-cut", "--last", "--json",
                                     "--run-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    streams = doc["modes"]["broken"]["streams"]
    assert [s["request_id"] for s in streams] == ["main-1", "extra-1", "extra-2"]
    assert streams[0]["trace"] == f"streamlab trace main-1 --run-dir {tmp_path}"
    assert set(doc["modes"]) == {"broken", "fixed"}

    text = CliRunner().invoke(app, ["scenario", "show", "idle-cut", "--last",
                                    "--run-dir", str(tmp_path)])
    assert text.exit_code == 0, text.output
    assert "streamlab trace extra-2" in text.output


@pytest.mark.anyio
async def test_a_crashed_run_still_names_the_streams_it_opened(tmp_path: Path) -> None:
    lab = FakeLab(LabOptions(run_dir=tmp_path))
    scenario = replace(registry.get("idle-cut"), measure=_crashes, needs=frozenset())
    with pytest.raises(RuntimeError):
        await run(lab, scenario, "broken", Timing())
    kept = last_run(artifacts_dir(lab), "idle-cut")
    assert kept is not None
    broken = kept["modes"]["broken"]
    assert (broken["status"], broken["request_ids"]) == ("error", ["crashed-1"])
    assert "the client fell over" in broken["reason"]


def test_show_last_without_a_run_says_how_to_get_one(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["scenario", "show", "buffering", "--last", "--json",
                                     "--run-dir", str(tmp_path)])
    assert shown.exit_code == 1
    assert "streamlab scenario run buffering" in json.loads(shown.stdout)["error"]["message"]


def test_a_fake_lab_without_a_run_dir_is_left_alone() -> None:
    lab = FakeLab()
    assert not lab.run_dir.exists()
    scenario = replace(registry.get("idle-cut"), measure=_judged, needs=frozenset())
    asyncio.run(run(lab, scenario, "fixed", Timing()))
    assert not lab.run_dir.exists()
