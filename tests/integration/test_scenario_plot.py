"""`streamlab scenario run NAME --plot FILE` against the real lab: the arrivals
the measure recorded become a PNG with a row per mode, token ticks and the
cut's mark, and the report lists it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamlab.cli import app
from streamlab.experiments.scenarios.plot import EVENT_COLOURS, Arrivals
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.local_only(
    "the plot is drawn from the client's own clock: the target's kind changes nothing")]

TICK = "#1f77b4"  # plot.py's token colour


def pixels_of(path: Path, colour: str) -> int:
    """How many pixels of the PNG are (near) `colour`."""
    import matplotlib.image
    import numpy as np

    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)
    image = matplotlib.image.imread(path)[..., :3] * 255  # a PNG reads as floats in [0, 1]
    return int(np.all(np.abs(image - rgb) <= 30, axis=-1).sum())


def test_resume_plot_shows_both_modes_ticks_and_the_cut(lab: LabTarget, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "resume.png"
    result = CliRunner().invoke(app, ["scenario", "run", "resume", "--plot", str(png),
                                      "--json", "--run-dir", str(lab.run_dir)])
    assert result.exit_code == 0, result.output

    report = json.loads(result.stdout)
    assert {"kind": "plot", "path": str(png), "title": "resume: token arrivals"} in \
        report["artifacts"]
    # What was drawn: both modes' arrivals, read back from the runs' timelines.
    runs = {run["variant"]: run for run in report["parts"][0]["parts"]}
    drawn = {}
    for mode, run in runs.items():
        [timeline] = [a["path"] for a in run["artifacts"] if a["path"].endswith("-arrivals.json")]
        drawn[mode] = Arrivals.from_json(json.loads(Path(timeline).read_text()))
    assert 0 < len(drawn["broken"].tokens) < len(drawn["fixed"].tokens)
    assert [kind for _, kind in drawn["broken"].events] == ["cut"]
    assert [kind for _, kind in drawn["fixed"].events] == ["cut", "restore"]
    # Non-trivial: a PNG with token ticks and the cut's red line in it.
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pixels_of(png, TICK) > 100  # 26 ticks: ~200 pixels at 100 dpi
    assert pixels_of(png, EVENT_COLOURS["cut"]) > 50
