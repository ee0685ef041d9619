"""The steady-state overhead estimate and its placebo (liver/controller/report.py), on made-up
step records, and the bench's refusal of bad arguments (no process is started)."""

import pytest

from liver.bench import reconfig
from liver.controller import report


def _steps(times_s, gen=0, t0=100.0):
    out, t = [], t0
    for i, dt in enumerate(times_s):
        t += dt
        out.append({"step": i + 1, "generation": gen, "step_s": dt, "time": t})
    return out


def _event(steps, first_preparing, last_preparing):
    """A window from just before step ``first_preparing`` ends to the end of ``last_preparing``."""
    a = steps[first_preparing - 2]["time"] + 1e-6
    return {"old_generation": 0, "t_event": a, "switch_start": steps[last_preparing - 1]["time"]}


def test_preparing_steps_against_the_20_before():
    times = [1.0] * 40 + [1.1] * 5 + [1.0] * 5  # 5 preparing steps 10% longer
    steps = _steps(times)
    ev = _event(steps, 41, 45)
    ratios, calm = report.preparing_ratios(steps, [ev])
    assert ratios == pytest.approx([1.1] * 5)
    assert calm == len(steps) - 1 - 5  # the generation's first step is left out
    # the placebo: the 5 steps before the window against the 20 before those: nothing there
    assert report.placebo_ratios(steps, [ev]) == pytest.approx([1.0] * 5)


def test_placebo_sees_a_drift_the_estimate_would_also_see():
    times = [1.0] * 21 + [1.2] * 14 + [1.2] * 5  # the machine slowed down before the event
    steps = _steps(times)
    ev = _event(steps, 36, 40)
    assert report.placebo_ratios(steps, [ev]) == pytest.approx([1.2] * 5)
    assert report.preparing_ratios(steps, [ev])[0] == pytest.approx([1.0] * 5)  # 20 before: 1.2


def test_placebo_needs_a_baseline_before_it():
    steps = _steps([1.0] * 10)
    assert report.placebo_ratios(steps, [_event(steps, 8, 10)]) == []


def test_interval_resamples_windows():
    lo, hi = report.median_ci95([[1.0, 1.0], [1.1, 1.1], [1.2, 1.2]])
    assert -1e-9 <= lo <= hi <= 0.2 + 1e-9
    assert report.median_ci95([[1.0]]) is None


@pytest.mark.parametrize("kw, field", [({"repeats": 0}, "--repeats"), ({"steps": 1}, "--steps"),
                                       ({"calm": 1}, "--calm-steps"), ({"cycles": 0}, "--cycles"),
                                       ({"world": 3}, "--world")])
def test_bench_refuses_bad_arguments_naming_them(kw, field):
    with pytest.raises(ValueError, match=field):
        reconfig.run(**kw)


def test_the_run_summary_states_the_overhead_with_its_interval_and_placebo_or_says_it_was_not_measured():
    """`make demo` once headlined "+69.52%": one median of a few steps. The summary now gives the
    interval and the placebo beside it, or says why there is no figure."""
    from liver.controller.report import overhead_line
    one = {"steady_overhead": 0.6952, "steady_overhead_ci95": None, "steps_preparing": 3}
    assert "not measured" in overhead_line(one) and "69" not in overhead_line(one)
    both = {"steady_overhead": 0.01, "steady_overhead_ci95": [-0.02, 0.03], "steps_preparing": 40,
            "steady_overhead_placebo": 0.0, "steady_overhead_placebo_ci95": [-0.03, 0.02]}
    line = overhead_line(both)
    assert "+1.00% (95% interval -2.00% to +3.00%, 40 steps)" in line and "within the drift" in line
    apart = {**both, "steady_overhead_ci95": [0.05, 0.09]}
    assert "beyond the drift" in overhead_line(apart)
    wide = {"steady_overhead": -0.0099, "steady_overhead_ci95": [-0.186, 0.2495], "steps_preparing": 303}
    assert "no placebo" in overhead_line(wide) and "too wide to tell" in overhead_line(wide)
