"""Runs one scenario in one mode against a lab that is up, and judges it.

The runner owns the toxics: it resets Toxiproxy, applies the mode's toxics,
measures, and resets again on every exit path, so a failed run leaves the lab
clean. A mode's outcome is *as expected* when all of its checks hold; it
*discriminates* when the other mode's checks fail on the same figures, which
is what proves a check would catch the thing it is about.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamlab.experiments.report import CheckResult, Figures, judge
from streamlab.experiments.scenarios.model import MODES, Mode, Scenario
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget


@dataclass
class Outcome:
    scenario: str
    mode: Mode
    story: str
    figures: Figures
    checks: list[CheckResult] = field(default_factory=list)
    other_mode_checks: list[CheckResult] = field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        return all(c.holds for c in self.checks)

    @property
    def discriminates(self) -> bool:
        """The other mode's checks do not all pass here."""
        return not all(c.holds for c in self.other_mode_checks)

    @property
    def verdict(self) -> str:
        if not self.as_expected:
            return "UNEXPECTED"
        return "broke as expected" if self.mode == "broken" else "works as expected"

    def explain(self) -> str:
        lines = [f"{self.scenario} [{self.mode}] {self.verdict}: {self.story}"]
        lines += [f"  {'ok  ' if c.holds else 'FAIL'} {c.description}" for c in self.checks]
        lines += [f"  figures: {self.figures}"]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "mode": self.mode, "story": self.story,
            "verdict": self.verdict, "as_expected": self.as_expected,
            "discriminates": self.discriminates, "figures": self.figures,
            "checks": [{"check": c.description, "holds": c.holds, "why": c.check.why}
                       for c in self.checks],
        }


@dataclass(frozen=True)
class Plan:
    """The runs of `scenario run ... --repeat N [--shuffle] [--seed S]`: one list
    of (scenario, mode) per repeat. Shuffled, each repeat has its own order,
    drawn from one seed, so an order that failed can be replayed with --seed."""

    seed: int | None  # None: not shuffled (catalogue order, broken before fixed)
    rounds: tuple[tuple[tuple[str, Mode], ...], ...]


def plan_runs(names: Sequence[str], modes: Sequence[Mode], *, repeat: int = 1,
              shuffle: bool = False, seed: int | None = None) -> Plan:
    """Every (scenario, mode) pair once per repeat; with `shuffle`, in an order of
    its own per repeat (modes of one scenario are shuffled apart too: a mode
    must not depend on the other having run first). A seed is drawn when none
    is given, and returned so it can be printed."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    pairs = [(name, mode) for name in names for mode in modes]
    if not shuffle:
        return Plan(None, tuple(tuple(pairs) for _ in range(repeat)))
    if seed is None:
        seed = secrets.randbelow(2**32)
    rng = random.Random(seed)
    rounds = []
    for _ in range(repeat):
        order = list(pairs)
        rng.shuffle(order)
        rounds.append(tuple(order))
    return Plan(seed, tuple(rounds))


def timing_for(lab: LabTarget, **overrides: Any) -> Timing:
    """The default timing, with the idle timeout the lab's nginx really has and a
    think pause twice as long, and the gateway's keepalive as the lab sets it
    (unless overridden)."""
    idle = lab.options.nginx.short_read_timeout_s
    # The lab's own overrides on top of this shell's STREAMLAB_* (which the
    # services started from it inherit), on top of the defaults.
    gateway = lab.options.gateway_settings()
    engine = lab.options.engine_settings()
    timing = replace(Timing(), idle_timeout_s=idle, think_s=2 * idle,
                     engine_dead_after_s=gateway.engine_keepalive_s
                     + gateway.engine_keepalive_timeout_s,
                     gateway_dead_after_s=engine.keepalive_s + engine.keepalive_timeout_s)
    return replace(timing, **{k: v for k, v in overrides.items() if v is not None})


async def run(lab: LabTarget, scenario: Scenario, mode: Mode, timing: Timing) -> Outcome:
    variant = scenario.variant(mode)
    other: Mode = MODES[1] if mode == MODES[0] else MODES[0]
    with lab.toxiproxy() as toxiproxy:
        toxiproxy.reset()
        try:
            for hop, toxic in variant.setup.toxics:
                # Every hop of the kind: with replicas, a stream may use any of them.
                for each in lab.hops_of(hop):
                    toxiproxy.add_toxic(each, toxic)
            figures = await scenario.measure(lab, variant.setup, timing)
        finally:
            toxiproxy.reset()
    return Outcome(
        scenario=scenario.name, mode=mode, story=variant.story, figures=figures,
        checks=list(judge(variant.expect, figures, timing)),
        other_mode_checks=list(judge(scenario.variant(other).expect, figures, timing)),
    )
