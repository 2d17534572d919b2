"""The scenario runner against a FakeLab: figures are scripted, so what is under
test is the runner's own work: which toxics it puts on which hops, that it
takes them off on every exit path, and how it judges a mode on its figures.

The assertions use what the runner's result has whatever its class
(`as_expected`, `discriminates`, `verdict`, `checks`, `figures`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios import registry
from streamlab.experiments.scenarios.model import Measure, Mode, Scenario, Setup, Variant
from streamlab.experiments.scenarios.runner import run, timing_for
from streamlab.experiments.timing import Timing
from streamlab.lab.fake import DEFAULT_CAPABILITIES, FakeLab
from streamlab.lab.local import LabOptions
from streamlab.lab.nginx import NginxOptions
from streamlab.lab.target import LabTarget
from streamlab.lab.toxiproxy import Toxic, ToxiproxyError

pytestmark = pytest.mark.anyio

TIMING = Timing()
LATENCY = Toxic("latency", {"latency": 600, "jitter": 0})
CUT = Toxic("limit_data", {"bytes": 100})

# A scenario of the catalogue's shape: a held-back first token is broken, one
# right after prefill is fixed (the bar follows the timing: 0.8 s here).
FIXED_FIGURES: Figures = {"done": True, "ttft_s": 0.36}
BROKEN_FIGURES: Figures = {"done": True, "ttft_s": 1.31}


def scripted(figures: Figures, seen: list[dict[str, tuple[str, ...]]] | None = None) -> Measure:
    """A measure that returns `figures`, noting first which toxics are on which hop
    (read through the lab's Toxiproxy client, as a real measure would reach it)."""
    async def measure(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
        if seen is not None:
            with lab.toxiproxy() as toxiproxy:
                seen.append({hop: tuple(t["name"] for t in proxy["toxics"])
                             for hop, proxy in toxiproxy.proxies().items() if proxy["toxics"]})
        return dict(figures)
    return measure


def held_back(measure: Measure, broken_toxics: tuple[tuple[str, Toxic], ...] = ()) -> Scenario:
    return Scenario(
        name="held-back", summary="a first token held back", measure=measure,
        broken=Variant(Setup(toxics=broken_toxics),
                       (Check("ttft_s", ">=", 1.0, "held back"), Check("done", "==", True)),
                       "held back"),
        fixed=Variant(Setup(),
                      (Check("ttft_s", "<=", lambda t: t.prefill_s + 2 * t.gap_s + t.tolerance_s),
                       Check("done", "==", True)),
                      "right after prefill"))


async def test_a_fixed_run_whose_checks_hold_is_as_expected_and_discriminates() -> None:
    outcome = await run(FakeLab(), held_back(scripted(FIXED_FIGURES)), "fixed", TIMING)

    assert outcome.figures == FIXED_FIGURES
    assert [(c.check.figure, c.holds) for c in outcome.checks] == [("ttft_s", True),
                                                                    ("done", True)]
    assert outcome.as_expected
    assert outcome.discriminates  # the broken mode's "held back" fails on these figures
    assert outcome.verdict == "works as expected"


async def test_the_broken_thing_under_the_fixed_modes_checks_is_unexpected() -> None:
    outcome = await run(FakeLab(), held_back(scripted(BROKEN_FIGURES)), "fixed", TIMING)

    assert not outcome.as_expected
    assert outcome.verdict == "UNEXPECTED"
    assert [c.description for c in outcome.checks if not c.holds] == ["ttft_s <= 0.8"]


async def test_figures_both_modes_accept_do_not_discriminate() -> None:
    """The proof a check would catch its broken thing is that the other mode's
    checks fail; figures that pass both say the checks cannot tell them apart."""
    ambiguous: Figures = {"done": True, "ttft_s": 0.8}
    scenario = held_back(scripted(ambiguous))
    scenario = replace(scenario, broken=replace(scenario.broken, expect=(
        Check("ttft_s", ">=", 0.5), Check("done", "==", True))))

    outcome = await run(FakeLab(), scenario, "fixed", TIMING)

    assert outcome.as_expected
    assert not outcome.discriminates


async def test_each_toxic_goes_on_every_hop_of_its_kind_and_comes_off_after() -> None:
    lab = FakeLab(LabOptions(gateways=2, engines=2))
    seen: list[dict[str, tuple[str, ...]]] = []
    scenario = held_back(scripted(BROKEN_FIGURES, seen),
                         (("engine", LATENCY), ("upstream", CUT), ("edge", LATENCY)))

    outcome = await run(lab, scenario, "broken", TIMING)

    assert outcome.verdict == "broke as expected"
    # While the measure ran: both engines' hops and both gateways' hops, each once.
    assert seen == [{"edge": ("latency_downstream",),
                     "upstream": ("limit_data_downstream",),
                     "upstream-2": ("limit_data_downstream",),
                     "engine": ("latency_downstream",),
                     "engine-2": ("latency_downstream",)}]
    fake = lab.fake_toxiproxy
    assert fake.active() == {}
    ops = fake.ops()
    assert (ops[0], ops[-1]) == ("reset", "reset")  # a clean start, a clean end
    assert ops.count("add_toxic") == 5


async def test_the_toxics_come_off_when_the_measure_raises() -> None:
    lab = FakeLab(LabOptions(engines=2))
    seen: list[dict[str, tuple[str, ...]]] = []
    measure = scripted(BROKEN_FIGURES, seen)

    async def crashes(target: LabTarget, setup: Setup, timing: Timing) -> Figures:
        await measure(target, setup, timing)
        raise RuntimeError("the client crashed mid-stream")

    try:
        outcome = await run(lab, held_back(crashes, (("engine", LATENCY),)), "broken", TIMING)
    except RuntimeError:
        pass
    else:  # a runner may report the crash instead of raising it; never as a pass
        assert not outcome.as_expected

    assert seen == [{"engine": ("latency_downstream",), "engine-2": ("latency_downstream",)}]
    assert lab.fake_toxiproxy.active() == {}
    assert lab.fake_toxiproxy.ops()[-1] == "reset"


async def test_the_toxics_come_off_when_a_hop_refuses_one() -> None:
    """A toxic for a hop this lab lacks (`store`: no Redis here) fails half-way
    through the setup; what was already applied comes off again."""
    lab = FakeLab()
    scenario = held_back(scripted(BROKEN_FIGURES), (("edge", LATENCY), ("store", LATENCY)))

    with pytest.raises(ToxiproxyError, match="404"):
        await run(lab, scenario, "broken", TIMING)

    assert lab.fake_toxiproxy.active() == {}
    assert lab.fake_toxiproxy.ops() == ["reset", "add_toxic", "reset"]


def test_the_timing_follows_the_labs_own_settings() -> None:
    lab = FakeLab(LabOptions(
        nginx=NginxOptions(short_read_timeout_s=3.0),
        gateway_env={"STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_S": "1",
                     "STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_TIMEOUT_S": "1"},
        engine_env={"STREAMLAB_ENGINE_KEEPALIVE_S": "2",
                    "STREAMLAB_ENGINE_KEEPALIVE_TIMEOUT_S": "1"}))

    timing = timing_for(lab, tokens=7)

    assert (timing.idle_timeout_s, timing.think_s) == (3.0, 6.0)
    assert (timing.engine_dead_after_s, timing.gateway_dead_after_s) == (2.0, 3.0)
    assert timing.tokens == 7


# ---- real catalogue scenarios on the figures real runs produce ----------------------
# Each pair: what the broken thing and the fixed thing measure on the lab (the
# shapes of measures.py and lifecycle.py; idle-cut's are docs/scenarios.md's run).
REAL_RUNS: dict[str, dict[Mode, Figures]] = {
    "buffering": {
        # nginx buffers and gzips: every byte arrives at the end, in one lump.
        "broken": {"hung": False, "status": 200, "tokens": 20, "done": True, "error_code": "",
                   "first_byte_s": 1.318, "ttft_s": 1.319, "total_s": 1.322,
                   "first_byte_share": 0.997, "token_spread_share": 0.002},
        # proxy_buffering off: the role chunk at once, tokens at the model's pace.
        "fixed": {"hung": False, "status": 200, "tokens": 20, "done": True, "error_code": "",
                  "first_byte_s": 0.011, "ttft_s": 0.358, "total_s": 1.327,
                  "first_byte_share": 0.008, "token_spread_share": 0.716},
    },
    "idle-cut": {
        "broken": {"hung": False, "tokens": 3, "done": False, "error_code": "transport",
                   "pings": 0, "silence_before_end_s": 1.903, "total_s": 2.372,
                   "nginx_upstream_timeouts": 1, "gateway_log_errors": 0},
        "fixed": {"hung": False, "tokens": 20, "done": True, "error_code": "", "pings": 10,
                  "silence_before_end_s": 0.001, "total_s": 5.319,
                  "nginx_upstream_timeouts": 0, "gateway_log_errors": 0},
    },
    "abandoned-tab": {
        # The detached relay: nobody cancels, the engine writes all 20 tokens.
        "broken": {"client_tokens": 3, "engine_state": "completed", "tokens_generated": 20,
                   "tokens_after_client_left": 17, "tokens_after_cancel": 0,
                   "cancel_latency_ms": None},
        "fixed": {"client_tokens": 3, "engine_state": "cancelled", "tokens_generated": 4,
                  "tokens_after_client_left": 1, "tokens_after_cancel": 0,
                  "cancel_latency_ms": 2.4},
    },
    "client-watchdog": {
        # A black-holed edge: no byte ever; without a read timeout the harness gives up.
        "broken": {"hung": True, "total_s": 4.7, "done": False, "tokens": 0,
                   "error_code": "", "client_error": "none: still waiting after 4.7 s"},
        "fixed": {"hung": False, "status": 200, "tokens": 0, "done": False,
                  "error_code": "timeout", "total_s": 1.004},
    },
}


def other(mode: Mode) -> Mode:
    return "fixed" if mode == "broken" else "broken"


@pytest.mark.parametrize("mode", ["broken", "fixed"])
@pytest.mark.parametrize("name", sorted(REAL_RUNS))
async def test_a_catalogue_scenarios_checks_tell_its_modes_apart(name: str, mode: Mode) -> None:
    scenario = registry.get(name)
    own, others = REAL_RUNS[name][mode], REAL_RUNS[name][other(mode)]

    # A fake lab with what the scenario declares it needs (idle-cut reads logs).
    lab = FakeLab(capabilities=DEFAULT_CAPABILITIES | scenario.needs)
    on_own = await run(lab, replace(scenario, measure=scripted(own)), mode, TIMING)
    on_others = await run(lab, replace(scenario, measure=scripted(others)), mode, TIMING)

    assert on_own.as_expected, [c.description for c in on_own.checks if not c.holds]
    assert on_own.discriminates
    assert not on_others.as_expected
    assert on_others.verdict == "UNEXPECTED"


async def test_a_catalogue_scenarios_toxics_reach_the_hops_it_names() -> None:
    """client-watchdog black-holes the edge in both modes: the runner puts that
    toxic on the edge hop and nowhere else, and takes it off."""
    lab = FakeLab()
    seen: list[dict[str, tuple[str, ...]]] = []
    measure = scripted(REAL_RUNS["client-watchdog"]["fixed"], seen)

    await run(lab, replace(registry.get("client-watchdog"), measure=measure), "fixed", TIMING)

    assert seen == [{"edge": ("timeout_downstream",)}]
    assert lab.fake_toxiproxy.active() == {}
