"""``liver sim``: a discrete-event simulator (SimPy) of elastic training under resource events,
calibrated from this project's own measured runs, to project LiveR beyond the machines it ran on.

- ``models.py``: model presets (1B to 175B) and the bytes of their training state;
- ``profile.py``: a hardware profile (links, storage, start-up costs) and the calibrated ones;
- ``costs.py``: each phase of a live handoff and of a restart, and a step's time, as functions of
  the model, the configurations, the ranks and the profile (the bytes a rank moves come from the
  project's own planner);
- ``results.py``: the JSON under bench/results, read as measured handoffs, steps and direct
  measurements;
- ``calibrate.py``: the fit of a profile to them;
- ``validate.py``: the fit against measurements it did not see (leave-one-out, a held-out run,
  held-out steps, DCP measured directly, the controller's choice on CPU);
- ``sources.py``: event streams (a schedule, a spot trace, a synthetic volatility regime);
- ``engine.py``: the job under those events, for live, restart from storage, restart from memory
  and data-parallel-only live resizing; goodput;
- ``project.py``: the projections (downtime, preparation against notice windows, goodput), JSON
  and PNG.
"""
