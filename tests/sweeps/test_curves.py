"""Dev-curve readings (sweeps/curves.py) against hand-worked numbers, and the section sweeps/tables/ writes."""

import math

import pytest

from sweeps import curves, tables

# (step, loss, perplexity): perplexities chosen by hand, not exp(loss), so the two fields cannot be swapped unseen.
CURVE = [(100, 3.0, 20.0), (200, 2.0, 8.0), (300, 1.5, 5.0), (400, 1.4, 4.0), (500, 1.38, 3.9)]


def test_dev_curve_keeps_the_split_and_a_resumed_runs_last_record_per_step():
    records = [
        {"step": 50, "loss": 9.0},
        {"step": 100, "split": "val", "loss": 3.5, "perplexity": 33.0},
        {"step": 100, "split": "test", "loss": 1.0, "perplexity": 2.7},
        {"step": 100, "split": "val", "loss": 3.0, "perplexity": 20.0},
        {"step": 200, "split": "val", "loss": 2.0, "perplexity": 8.0},
    ]
    assert curves.dev_curve(records, "val") == [(100, 3.0, 20.0), (200, 2.0, 8.0)]


def test_tail_improvement_compares_the_evaluation_at_80_percent_with_the_last():
    assert curves.tail_improvement(CURVE) == pytest.approx((4.0 - 3.9) / 4.0)
    # tail 0.5: the last evaluation at or before step 250 is step 200's
    assert curves.tail_improvement(CURVE, 0.5) == pytest.approx((8.0 - 3.9) / 8.0)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(curve=CURVE[:1]), "two dev evaluations"),
        (dict(curve=CURVE, tail=1.0), "tail"),
        (dict(curve=[(480, 1.0, 3.0), (500, 0.9, 2.0)], tail=0.1), "no dev evaluation"),
    ],
)
def test_tail_improvement_refuses_what_it_cannot_measure(bad, match):
    with pytest.raises(ValueError, match=match):
        curves.tail_improvement(**bad)


def test_steps_to_loss_interpolates_between_evaluations():
    assert curves.steps_to_loss(CURVE, 2.5) == pytest.approx(150.0)  # halfway from 3.0 at 100 to 2.0 at 200
    assert curves.steps_to_loss(CURVE, 1.45) == pytest.approx(350.0)
    assert curves.steps_to_loss(CURVE, 3.2) == 100.0  # reached by the first evaluation
    assert curves.steps_to_loss(CURVE, 1.0) is None


def test_curves_section_compares_steps_to_the_worst_final_loss():
    slow = [(100, 4.0, 50.0), (200, 3.0, 20.0), (300, 2.0, 8.0), (400, 1.9, 7.0), (500, 1.8, 6.0)]
    text = tables.curves_markdown([(1, slow), (8, CURVE), (8, CURVE)], {"key": "h", "reference": 8})
    # target 1.8, h=1's final loss: h=1 reaches it at its last step, h=8 between its evaluations at 200 and 300
    h8_steps = 200 + 100 * (2.0 - 1.8) / (2.0 - 1.5)
    assert "steps to dev loss 1.800" in text and "evaluated every 100 steps" in text
    h1_row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    h8_row = next(line for line in text.splitlines() if line.startswith("| 8 |"))
    assert f"| {500:,.0f} | {500 / h8_steps:.2f} | 1 |" in h1_row
    assert f"| {h8_steps:,.0f} ± 0 | 1.00 | 2 |" in h8_row  # the sd in its mean's format
    assert f"{100 * (7.0 - 6.0) / 7.0:.2f} %" in h1_row
    assert math.isclose(h8_steps, 240.0)


def test_the_curves_section_names_each_evaluation_cadence_with_its_runs():
    short = [(400, 2.0, 7.4), (800, 1.8, 6.0), (4000, 1.7, 5.5)]
    long = [(800, 2.0, 7.4), (1600, 1.8, 6.0), (8000, 1.7, 5.5)]
    assert tables.evaluation_cadence([short, short]) == "evaluated every 400 steps"
    assert (
        tables.evaluation_cadence([short, long])
        == "evaluated every 400 steps (runs of 4,000 steps), every 800 (runs of 8,000)"
    )
    text = tables.curves_markdown([("h8_4000", short), ("h8_8000", long)], {"key": "run", "reference": "h8_4000"})
    assert "## Dev curves (evaluated every 400 steps (runs of 4,000 steps), every 800 (runs of 8,000))" in text
