"""What the console prints by default (issue 47): sample tables spaced as `num_sample_generations` says, and an
explained variance that cannot be computed shown as "–" with the reason, once."""

from __future__ import annotations

import math

import pytest

from vcppo_trl.trainer.completions import sample_steps
from vcppo_trl.trainer.console import EV_UNDEFINED, CompactPrinterCallback, format_update_line


@pytest.mark.parametrize(
    ("samples", "max_steps", "expected"),
    [
        (10, 18, {2, 4, 6, 8, 9, 11, 13, 15, 17, 18}),
        (10, 100, set(range(10, 101, 10))),
        (3, 3, {1, 2, 3}),
        (10, 4, {1, 2, 3, 4}),
        (0, 50, set()),
        (1, 7, {7}),
    ],
)
def test_printouts_are_as_many_as_asked_spread_over_the_run(samples, max_steps, expected):
    steps = sample_steps(samples, max_steps)
    assert steps == expected
    assert len(steps) == min(samples, max_steps)


def test_an_undefined_explained_variance_reads_as_a_dash_and_is_explained_once(capsys):
    line = format_update_line({"episode": 1, "value/explained_variance": math.nan, "objective/kl": 0.0}, 1, 3)
    assert "ev –" in line and "nan" not in line
    printer = CompactPrinterCallback()
    printer._ev_said = [False]

    class State:
        is_world_process_zero = True
        global_step = 1
        max_steps = 3

    for _ in range(2):
        printer.on_log(None, State, None, logs={"episode": 1, "value/explained_variance": math.nan})
    out = capsys.readouterr().out
    assert out.count(EV_UNDEFINED) == 1
    assert out.count("ev –") == 3  # two lines, and the explanation's own
