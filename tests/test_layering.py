"""The architecture's import rules, checked on the source: who may know whom."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "liver"


def imports(package: str) -> dict[str, set[str]]:
    """module path -> every module it imports (absolute names)."""
    out = {}
    for f in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(f.relative_to(ROOT.parent))] = names
    return out


def offenders(package: str, bad) -> list[str]:
    return [f"{m} imports {n}" for m, names in imports(package).items() for n in sorted(names) if bad(n)]


@pytest.mark.parametrize("package", ["runtime", "controller", "checkpoint", "transfer", "protocol"])
def test_the_runtime_knows_an_engine_only_through_its_interface(package):
    assert offenders(package, lambda n: n.startswith("liver.engine") and n not in
                     ("liver.engine.interface", "liver.engine.loop", "liver.engine.digest")) == []


def test_the_engine_knows_nothing_of_the_runtime_that_drives_it():
    """The loop's API (``liver.engine.loop``: Step, Steps, the loop's errors) is the engine
    boundary's; the runtime drives it (its ``Driver``): no import back, in a function body either."""
    for package in ("engine", "world", "resource_view", "planner", "transfer", "checkpoint"):
        assert offenders(package, lambda n: n.startswith(("liver.runtime", "liver.controller"))
                         and n not in ("liver.runtime.config",)) == [], package


def test_the_agent_knows_nothing_of_training():
    """It speaks the agent protocol (``liver.protocol.agent``, checked by ``liver.config.fields``)
    and nothing else of the job: how to make processes comes to it as import strings."""
    training = ("torch", "liver.runtime", "liver.engine", "liver.controller", "liver.world", "liver.checkpoint",
                "liver.transfer", "liver.planner", "liver.protocol", "liver.config")
    assert offenders("agent", lambda n: n.startswith(training) and n not in
                     ("liver.protocol.agent", "liver.config.fields")) == []


def test_host_utilities_and_the_lower_half_stand_alone():
    assert offenders("host", lambda n: n.startswith("liver.") and not n.startswith("liver.host")) == []
    for package in ("topology", "resource_view", "planner"):
        assert offenders(package, lambda n: n.startswith(("torch", "liver.runtime", "liver.controller",
                                                          "liver.engine", "liver.world"))) == []


def test_the_protocol_belongs_to_neither_side():
    allowed = ("liver.protocol", "liver.config", "liver.topology", "liver.engine.interface", "liver.checkpoint.config",
               "liver.runtime.config", "liver.transfer.config")
    assert offenders("protocol", lambda n: n.startswith("liver.") and not n.startswith(allowed)) == []
    assert offenders("runtime", lambda n: n.startswith("liver.controller")) == []
    assert offenders("controller", lambda n: n.startswith("liver.runtime.") and n not in
                     ("liver.runtime.config", "liver.runtime.preload")) == []
