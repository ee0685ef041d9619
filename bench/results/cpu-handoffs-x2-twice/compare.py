"""The CPU handoffs (bench/results/cpu-handoffs-*) predicted three ways: with the H200's handoff terms, with the
CPU fit of all of them (in sample), and leave-one-out without the x8 run; the noise floor beside them."""
from pathlib import Path

from liver.sim import calibrate, results, validate

r = Path("bench/results")
ev = results.cpu_events(r)
base = {**calibrate.fit(*results.measurements(r))[0], **calibrate.fit_cpu(results.cpu_samples(r / "cpu-target-choice" / "target.json"))[0]}


def med(summary):
    return {q: round(v["median_abs_error"], 3) for q, v in summary.items()}


print("the H200's handoff terms:", med(validate._score([(e, validate.predict(e, base)) for e in ev], validate.QUANTITIES)["summary"]))
full = {**base, **calibrate.cpu_handoffs(base, {}, ev)[0]}
print("the CPU fit, in sample:", med(validate._score([(e, validate.predict(e, full)) for e in ev], validate.QUANTITIES)["summary"]))
print("leave-one-out, all:", med(validate.validate_cpu_handoffs(ev, base)["summary"]))
print("leave-one-out, without x8:", med(validate.validate_cpu_handoffs([e for e in ev if "x8" not in e.source], base)["summary"]))
print("the same event measured twice:", {q: round(v, 3) for q, v in validate.noise_floor(ev).items()})
