"""The examples for Slurm and Kubernetes, checked as far as a machine without either allows: the
scripts are valid shell, the controller is never in an allocation whose nodes get preemption
notices, the manifests define everything they name (volume claims, the Service, /dev/shm) and every
`liver` command line in them is one that `liver` itself accepts."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from liver.cli import parser

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "examples" / "slurm"
K8S = ROOT / "examples" / "kubernetes"


def liver_commands(text: str) -> list[list[str]]:
    """Each `liver ...` command line of a shell script (continuations joined, a variable's default
    taken, the others given example values)."""
    joined = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", text.replace("\\\n", " "))
    joined = re.sub(r"\$\{IFACE:\+[^}]*\}", "", joined)
    joined = re.sub(r"\$\{?(\w+)\}?", lambda m: {"PORT": "29400"}.get(m.group(1), "x"), joined)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("#") or "liver " not in line:
            continue
        words = shlex.split(line[line.index("liver "):].split(" &")[0].split(";")[0])
        out.append(words[1:])
    return out


def test_the_slurm_scripts_are_valid_shell_and_keep_the_controller_out_of_preempted_allocations():
    for script in SLURM.glob("*.sbatch"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    agents = (SLURM / "liver-agents.sbatch").read_text()
    ctl = (SLURM / "liver-controller.sbatch").read_text()
    assert "liver controller" not in agents and "--notice-sigterm" in agents and "--signal=TERM" in agents
    assert "liver agent" not in ctl and "--gpus-per-node" not in ctl and "journal.pkl" in ctl
    for args in liver_commands(agents) + liver_commands(ctl):
        parser().parse_args(args)


def yaml_docs() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all((K8S / "liver-job.yaml").read_text()) if d]


def test_the_kubernetes_manifests_define_what_they_name_and_run_commands_liver_accepts():
    docs = yaml_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    ctl = next(d for d in docs if d["metadata"]["name"] == "liver-controller" and d["kind"] in ("StatefulSet", "Deployment"))
    agents = next(d for d in docs if d["metadata"]["name"] == "liver-agent")
    assert ctl["spec"]["replicas"] == 1  # one controller per job
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == ctl["spec"]["template"]["metadata"]["labels"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"  # never exposed outside the cluster
    for d in (ctl, agents):
        pod = d["spec"]["template"]["spec"]
        for v in pod["volumes"]:
            if "persistentVolumeClaim" in v:
                assert ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in kinds
    pod = agents["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    shm = next(m for m in agent["volumeMounts"] if m["mountPath"] == "/dev/shm")
    vol = next(v for v in pod["volumes"] if v["name"] == shm["name"])
    assert vol["emptyDir"]["medium"] == "Memory" and vol["emptyDir"]["sizeLimit"]
    assert pod["terminationGracePeriodSeconds"] > int(agent["command"][agent["command"].index("--notice-sigterm") + 1])
    assert ("NetworkPolicy", "liver-controller") in kinds
    parser().parse_args(agent["command"][1:])
    script = ctl["spec"]["template"]["spec"]["containers"][0]["args"][0]
    for part in script.split("exec ")[1:]:
        words = shlex.split(part.split(";")[0])
        parser().parse_args(words[1:])
    assert (K8S / "Dockerfile").is_file() and "liver" in (K8S / "Dockerfile").read_text()
