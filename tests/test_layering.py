"""The architecture's import rules, checked on the source: who may know whom. Every import counts,
in a function body too, and ``from liver.x import y`` counts as ``liver.x.y`` where that is a module."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "liver"


def _module(name: str) -> bool:
    p = ROOT.parent / Path(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(package: str) -> dict[str, set[str]]:
    """module path -> every module it imports (absolute names)."""
    out = {}
    files = [ROOT / f"{package}.py"] if (ROOT / f"{package}.py").is_file() else sorted((ROOT / package).rglob("*.py"))
    for f in files:
        names = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names if _module(f"{node.module}.{a.name}")}
        out[str(f.relative_to(ROOT.parent))] = names
    return out


def offenders(package: str, bad) -> list[str]:
    return [f"{m} imports {n}" for m, names in imports(package).items() for n in sorted(names) if bad(n)]


def _under(name: str, packages) -> bool:
    return any(name == f"liver.{p}" or name.startswith(f"liver.{p}.") for p in packages)


#: a package's own table of the job file (``liver.X.config``): plain dataclasses anyone may read
def _config_leaf(name: str) -> bool:
    return name.endswith(".config") and name.count(".") == 2


# Each package and the packages it must not import: the layers from the bottom (topology, the
# view, the planner) through the engine boundary and the policy to the controller and the
# simulator, and the entry points (benches, command line) on top.
ABOVE_ALL = ("bench", "cli", "launch")
RULES = {
    "host": ("topology", "resource_view", "planner", "world", "protocol", "engine", "transfer", "checkpoint",
             "policy", "runtime", "agent", "controller", "sim", "config", "data") + ABOVE_ALL,
    "topology": ("resource_view", "planner", "world", "protocol", "engine", "transfer", "checkpoint", "policy",
                 "runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "resource_view": ("planner", "world", "protocol", "engine", "transfer", "checkpoint", "policy", "runtime",
                      "agent", "controller", "sim", "config") + ABOVE_ALL,
    "planner": ("world", "protocol", "engine", "transfer", "checkpoint", "policy", "runtime", "agent", "controller",
                "sim", "config") + ABOVE_ALL,
    "data": ("engine", "policy", "runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "world": ("engine", "transfer", "checkpoint", "policy", "runtime", "agent", "controller", "sim",
              "config") + ABOVE_ALL,
    "engine": ("transfer", "policy", "runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "transfer": ("policy", "runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "checkpoint": ("policy", "runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "protocol": ("policy", "runtime", "agent", "controller", "sim") + ABOVE_ALL,
    "policy": ("runtime", "agent", "controller", "sim", "config") + ABOVE_ALL,
    "runtime": ("policy", "agent", "controller", "sim") + ABOVE_ALL,
    "agent": ("policy", "controller", "sim") + ABOVE_ALL,
    "config": ("runtime", "agent", "controller", "sim") + ABOVE_ALL,
    "controller": ("sim",) + ABOVE_ALL,
    "bench": ("cli",),
    "sim": ("runtime", "agent", "controller") + ABOVE_ALL,
}


def test_every_package_has_a_rule():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(RULES), "a package without a rule, or a rule without a package"


@pytest.mark.parametrize("package", sorted(RULES))
def test_no_package_imports_a_layer_above_it(package):
    """A package's own config table (``liver.X.config``) is a leaf anyone may read: the job file's
    tables are owned by the packages they configure. Nothing else goes up; the policy reads none
    of them but the worker runtime's (its pacing share, a cost)."""
    bad = RULES[package]
    allowed = ("liver.runtime.config",) if package == "policy" else None
    assert offenders(package, lambda n: _under(n, bad) and not (
        _config_leaf(n) and n.split(".")[1] != "config" and (allowed is None or n in allowed))) == []


def test_the_config_leaves_are_leaves():
    """What anyone may import of a package imports nothing above the topology, the job file's
    fields and the policy's vocabulary (its pure grammar and decisions: no torch)."""
    for f in sorted(ROOT.glob("*/config.py")):
        mod = f"{f.parent.name}/config.py"
        names = imports(f.parent.name)[f"liver/{mod}"]
        assert [n for n in names if n.startswith("liver.") and not n.startswith(
            ("liver.topology", "liver.config.fields", "liver.policy.events", "liver.policy.decisions"))
            and not _config_leaf(n)] == [], mod
    for pure in ("events", "decisions"):  # (the vocabulary the leaves may read imports no more than they do)
        names = imports("policy")[f"liver/policy/{pure}.py"]
        assert [n for n in names if n == "torch" or n.startswith(("torch.", "liver.")) and not n.startswith(
            ("liver.topology", "liver.policy.events"))] == [], pure


@pytest.mark.parametrize("package", ["runtime", "controller", "checkpoint", "transfer", "protocol", "policy", "sim"])
def test_the_runtime_knows_an_engine_only_through_its_interface(package):
    """The simulator and the policy model the reference engine's jobs (the presets, measured runs):
    that engine's adapter (``liver.engine.reference``) is theirs to name; its internals are not."""
    allowed = ("liver.engine.interface", "liver.engine.loop", "liver.engine.digest")
    if package in ("policy", "sim"):
        allowed += ("liver.engine.reference",)
    assert offenders(package, lambda n: n.startswith("liver.engine.") and n not in allowed) == []


#: a model configuration's own fields (the reference engine's ``ModelConfig``): its engine's to read
MODEL_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_size", "vocab_size", "vocab_multiple", "padded_vocab_size",
                "head_dim", "num_params", "rope_theta", "norm_eps", "init_std")


@pytest.mark.parametrize("package", ["policy", "controller", "sim", "runtime", "transfer", "checkpoint", "planner",
                                     "protocol", "config"])
def test_above_the_engines_no_code_reads_a_model_configurations_fields(package):
    """The layout checks, the target choice, the cost model, the controller and the simulator know a
    model by its engine's facts (``EngineAdapter.facts``: ``ModelFacts``), whatever its configuration
    (a recipe's own dataclass): none of them reads ``ModelConfig``'s fields. (The simulator's
    presets make ``ModelConfig`` values, by keyword: that is the reference engine's model.)"""
    files = [ROOT / f"{package}.py"] if (ROOT / f"{package}.py").is_file() else sorted((ROOT / package).rglob("*.py"))
    found = [f"{f.relative_to(ROOT.parent)}:{node.lineno} .{node.attr}" for f in files
             for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.Attribute) and node.attr in MODEL_FIELDS]
    assert found == []
    layout = ast.parse((ROOT / "topology" / "layout.py").read_text())
    assert [n.attr for n in ast.walk(layout) if isinstance(n, ast.Attribute) and n.attr in MODEL_FIELDS] == []


def test_the_agent_knows_nothing_of_training():
    """It speaks the agent protocol (``liver.protocol.agent``, checked by ``liver.config.fields``)
    and holds the job's secret (``liver.protocol.secret``, for the workers it starts), and nothing
    else of the job: how to make processes comes to it as import strings."""
    training = ("torch", "liver.runtime", "liver.engine", "liver.controller", "liver.world", "liver.checkpoint",
                "liver.transfer", "liver.planner", "liver.protocol", "liver.config")
    assert offenders("agent", lambda n: n.startswith(training) and n not in
                     ("liver.protocol.agent", "liver.protocol.secret", "liver.config.fields", "liver.agent.config")) == []


def test_the_lower_half_stands_alone_without_torch():
    for package in ("topology", "resource_view", "planner", "host"):
        assert offenders(package, lambda n: n == "torch" or n.startswith("torch.")) == [], package


def test_the_protocol_belongs_to_neither_side():
    allowed = ("liver.protocol", "liver.config", "liver.topology", "liver.engine.interface", "liver.checkpoint.config",
               "liver.runtime.config", "liver.transfer.config")
    assert offenders("protocol", lambda n: n.startswith("liver.") and not n.startswith(allowed)) == []
    assert offenders("controller", lambda n: n.startswith("liver.runtime.") and n not in
                     ("liver.runtime.config", "liver.runtime.preload")) == []
