"""A hardware profile: what a phase of a handoff or a restart costs on a class of machines.

``calibration.json`` beside this file holds the profiles fitted to this project's own measured
runs (``liver sim calibrate``: ``calibrate.py``); every field records where its value came from
(``sources``): fitted, measured directly, or a stated setting (the link, storage and compute
figures of a class of machines this project has not run on, and the growth of group set-up with
the number of ranks, which two GPUs cannot show).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CALIBRATION = Path(__file__).with_name("calibration.json")
GB = 1e9


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    # a step: roofline at a sustained share of the peak
    peak_flops: float              # per GPU (bf16 dense)
    mfu: float                     # the share of the peak a step sustains, at wide matrix multiplies
    mfu_width: float = 0.0         # ... half of it where they are this wide (hidden size / TP; 0: any width)
    node_size: int = 8             # GPUs per node
    memory_bytes: float = 141e9    # per GPU
    intra_bw: float                # bytes/s a GPU sends one way within its node (NVLink), its collectives' link
    inter_bw: float                # ... to other nodes (its share of the node's NICs)
    copy_bw: float                 # bytes/s a GPU copies within its own memory
    transfer_share: float = 1.0    # a handoff's transfer: its busiest process's bytes sent and received together
                                   # a second, as a share of the link's one-way rate (its staging, its messages)
    dp_overlap: float = 0.5        # share of the gradient all-reduce hidden behind the backward pass
    # what a small model's step is made of on CPU processes (0 on GPUs: kernels and bytes dominate)
    cores: int | None = None       # processes beyond this share the cores (None: a device each)
    layer_op_s: float = 0.0        # a layer's forward and backward for one micro-batch, framework time
    tp_latency_s: float = 0.0      # one TP all-reduce's round trip, per extra rank of the group
    dp_latency_s: float = 0.0      # a gradient all-reduce round trip: per extra replica, per layer of a stage
    p2p_latency_s: float = 0.0     # one pipeline send or receive
    step_fixed_s: float = 0.0      # the rest of a step (optimizer, the boundary)
    # a live handoff
    switch_fixed_s: float          # the swap and the cut, beside the transfer
    switch_s_per_gb: float         # ... more per GB of a rank's new state (its tensors re-bound)
    first_step_s: float            # the boundary and the new generation's first step, beyond a normal one
    connect_tp_s: float            # ... more where it runs TP all-reduces (or stage sends) over a new process set
    connect_dp_s: float            # ... more where it runs the gradient all-reduce over a new process set
    nccl_first_s: float            # ... more where its processes run their first NCCL collective ever
    connect_p2p_s: float           # a joiner's first transfer over its new communicator, beside the bytes
    prepare_base_s: float          # building the Shadow World over the same processes, unpaced
    prepare_joiner_s: float        # ... with joiners, beside their boot, groups and mock warm-up
    prepare_cpu_s_per_task: float  # the companion's paced CPU work per transfer task of its process
    prepare_stall_s: float = 0.0   # training time a preparation stalls (its groups, its connections)
    prepare_stall_joiner_s: float = 0.0  # ... one with joiners (their rendezvous)
    joiner_boot_s: float           # a cold joiner forked from the zygote, before its mock world
    mock_s_per_gparam: float       # its mock-world warm-up, per billion parameters it holds
    group_init_s: float            # a new generation's communicators over new processes, at 2 ranks
    group_growth_s: float          # ... more per doubling of the ranks
    plan_s_per_krank: float        # the controller's planning, per 1,000 ranks
    # a restart
    save_fixed_s: float            # a DCP save's fixed part
    save_bw_per_rank: float        # bytes/s one rank writes a DCP checkpoint
    load_fixed_s: float            # a DCP load's fixed part
    load_bw_per_rank: float        # bytes/s one rank reads (and reshards) one
    storage_bw_per_gpu: float      # a job's share of a shared file system's sustained bandwidth, per GPU it holds
    host_bw: float                 # bytes/s between a GPU and host memory (restart from memory)
    process_start_s: float         # a fresh interpreter and its imports (two of a host starting together)
    cuda_init_s: float             # a new process's CUDA context
    host_read_bw: float = 0.0      # bytes/s a host's processes read together from its storage (0: no limit)
    host_start_growth: float = 0.0  # a start slower by this share per other process of its host, beyond two
    cuda_context_s: float = 0.0    # a forked process's CUDA context (a fresh one's is in process_start_s)
    rendezvous_s_per_rank: float   # the store's rendezvous, per rank
    restart_fixed_s: float         # the rest of a restart: stop, first step, what no part names
    restart_s_per_gb: float        # ... more per GB of a new rank's state (its allocation, the first step's)
    detect_s: float = 5.0          # a fail-stop noticed (heartbeat, collective timeout)
    # data-parallel-only live resizing (torchft): what the replicas that stay lose
    dp_join_stall_s: float         # a replica joins (its state sent by a peer, on the measured machine)
    dp_kill_stall_s: float         # a replica killed: the stall and the step that did not commit
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def replace(self, **kw: Any) -> "Profile":
        return dataclasses.replace(self, **kw)


# The paper's testbed class: A800 PCIe GPUs (312 TFLOP/s bf16, PCIe 4.0 peer copies), 200 Gb/s
# InfiniBand per node; storage at 1.25 Gb/s a GPU (the design's Figure 6(b) sweeps 0.25-2.0 Gb/s a
# GPU). Stated settings, not measured here.
A800_PCIE = {"peak_flops": 312e12, "intra_bw": 20 * GB, "inter_bw": 25 * GB / 8, "storage_bw_per_gpu": 1.25 * GB / 8,
             "host_bw": 20 * GB, "node_size": 8, "memory_bytes": 80e9}
# H200-class cluster links beyond one host: 8 x 400 Gb/s NICs per node (50 GB/s per GPU, each way);
# a shared file system's sustained 2 TB/s over the 16,384 GPUs of one training job (Llama 3's
# Tectonic: 122 MB/s a GPU). Published figures (calibrate.STATED); the intra-node ones are measured.
H200_CLUSTER = {"inter_bw": 50 * GB, "storage_bw_per_gpu": 2e12 / 16384}


@functools.lru_cache(maxsize=None)
def load(name: str, path: Path = CALIBRATION) -> Profile:
    """A calibrated profile ("h200"; "cpu": the CPU processes of this machine, its step times
    only), or one derived from H200's ("a800-pcie": the testbed class's links, storage and
    compute with the measured start-up costs)."""
    data = json.loads(path.read_text())
    base = data["profiles"]["h200"]
    if name == "h200":
        return Profile(name="h200", **base["values"], sources=base["sources"])
    if name == "cpu" and "cpu" in data["profiles"]:
        cpu = data["profiles"]["cpu"]
        return Profile(name="cpu", **{**base["values"], **cpu["values"]}, sources={**base["sources"], **cpu["sources"]})
    if name == "a800-pcie":
        srcs = dict(base["sources"], **{k: "stated setting (A800 PCIe, 200 Gb/s IB)" for k in A800_PCIE})
        return Profile(name="a800-pcie", **{**base["values"], **A800_PCIE}, sources=srcs)
    raise ValueError(f"profile={name!r}: allowed 'h200', 'a800-pcie', 'cpu'")


PROFILES = ("h200", "a800-pcie")  # the projections' (cpu: the controller's choice on CPU processes)
