"""`bench.controls_micro` (bench.instructions --controls) drives every control's scenario
to the end it must reach: each measured start decided, the admitted records the scenario
makes counted against what it must make (the bench refuses a figure otherwise)."""

from __future__ import annotations

import pytest

from bench.controls_micro import SCENARIOS, Bench, admitted_expected


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_decides_every_start_it_measures(scenario: str) -> None:
    bench = Bench(scenario, 20)
    _cpu, records = bench.run(window=False)
    assert records >= 1.0, "at least each start's own record"


def test_a_scenario_whose_admissions_fall_short_is_refused() -> None:
    bench = Bench("conc50", 20)
    bench.mode = None  # no engine: the runs never end, the queued starts never admitted
    with pytest.raises(SystemExit, match="admitted records"):
        bench.run(window=False)
    assert admitted_expected("conc50", 20) == 20
