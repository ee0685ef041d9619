"""The policy: what the controller and the simulator decide alike, below both of them.

- ``events``: the event grammar (``EventKind``, frozen ``Event``), schedules and spot traces.
- ``outcome``: what became of an event, as a value.
- ``decisions``: the pure decisions (the next event, a notice during Prepare, a scale-in's path, the end).
- ``target``: the one target choice: the configuration a GPU count gets.
- ``heal``, ``leaving``: which survivors a fail-stop heals from and keeps; which ranks leave a scale-in
  that names no node.
- ``costs``, ``profile``: the cost model (step, live handoff, restart) and its hardware profiles.

Nothing here imports the controller, the simulator, the worker runtime, the agent, the benches or
the command line (``tests/test_layering.py``).
"""
