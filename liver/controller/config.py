"""The controller's options."""

from __future__ import annotations

from dataclasses import dataclass


MODES = ("live", "restart", "restart-forked")


from liver.policy.decisions import JOIN_POLICIES  # (the policy's vocabulary: ``join_total``)


@dataclass(frozen=True, kw_only=True, slots=True)
class ControllerConfig:
    """- ``mode``: "live" handoffs, or the baseline: stop-and-restart through DCP with new processes
      as fresh interpreters ("restart") or forked from the agent's zygote ("restart-forked").
    - ``prepare_timeout_s``: a pending generation not ready after this is cancelled.
    - ``end_after_events``: the job ends this many steps after its last event; unset (or -1, as a
      job file writes it): it trains all of its steps.
    - ``endpoint``: serve the control endpoint (loopback HTTP, token in the run's control.json).
    - ``memory_gib``: per-GPU memory for the target choice; unset: no limit.
    - ``heal_timeout_s``: live mode, a rank lost without notice while every shard it held has a
      replica on a surviving rank: the survivors' reports of where they stopped are awaited this
      long, then the job is healed from their memory (no rollback); 0: always the checkpoint.
    - ``hang_timeout_s``: a worker whose heartbeat is older than this is hung (stopped, or stuck with
      every thread held) and is killed: a fail-stop like any other; 0: never.
    - ``host``, ``port``: where the control endpoint (and the job's store) listen: loopback by
      default; a job on several machines binds an address the agents reach ("0.0.0.0": all).
      ``port`` 0: any free one (the endpoint's; the store takes ``port + 1`` when it is set).
      ``advertise``: the name the workers on other machines reach the store by (a Kubernetes
      Service's, say); unset: ``host``, or this machine's name where ``host`` is 0.0.0.0.
    - ``on_join``: a node that registers while the job runs: "now" scale out onto its slots, "better"
      only when the new count's best configuration is estimated faster per sample, "never" (the
      operator decides, ``liver scale``).
    - ``agent_timeout_s``: a node agent silent this long has lost its node: a fail-stop of its
      ranks.
    - ``syncs_per_s``: the node agents' syncs it takes in a second, all nodes together: each syncs
      every ``max(0.1 s, nodes / syncs_per_s)`` with nothing to report, at once with news; a node
      is declared lost after ``agent_timeout_s`` or five of its intervals (`liver bench control-plane`).
    - ``long_poll``: each agent's heartbeat is a request the controller holds until it has a
      command for the node, or for the node's sync interval: a command reaches its node in a round
      trip, not at its next sync, for the same requests a second; the agent syncs only with news
      (false: every interval, and commands wait for the next sync).
    - ``stop_on_nonfinite_loss``: a step whose loss is not finite (NaN, inf) ends the job there
      (otherwise it is recorded and said once, and training goes on)."""

    mode: str = "live"
    prepare_timeout_s: float = 300.0
    end_after_events: int | None = 20
    endpoint: bool = True
    memory_gib: float | None = None
    heal_timeout_s: float = 30.0
    hang_timeout_s: float = 60.0
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    on_join: str = "now"
    agent_timeout_s: float = 10.0
    syncs_per_s: float = 1000.0
    long_poll: bool = True
    stop_on_nonfinite_loss: bool = False

    def __post_init__(self) -> None:
        if self.end_after_events == -1 and not isinstance(self.end_after_events, bool):
            object.__setattr__(self, "end_after_events", None)
        if self.mode not in MODES:
            raise ValueError(f"controller.mode={self.mode!r}: allowed {', '.join(map(repr, MODES))}")
        if not 0.1 <= self.prepare_timeout_s <= 86400.0:
            raise ValueError(f"controller.prepare_timeout_s={self.prepare_timeout_s!r}: allowed 0.1 to 86400 s")
        if self.end_after_events is not None and (isinstance(self.end_after_events, bool)
                                                  or not isinstance(self.end_after_events, int)
                                                  or self.end_after_events < 0):
            raise ValueError(f"controller.end_after_events={self.end_after_events!r}: allowed 0 or more steps, "
                             "or -1 (train every step)")
        if isinstance(self.heal_timeout_s, bool) or not 0 <= self.heal_timeout_s <= 3600:
            raise ValueError(f"controller.heal_timeout_s={self.heal_timeout_s!r}: allowed 0 (never heal) to 3600 s")
        if isinstance(self.hang_timeout_s, bool) or not (self.hang_timeout_s == 0 or 1 <= self.hang_timeout_s <= 86400):
            raise ValueError(f"controller.hang_timeout_s={self.hang_timeout_s!r}: allowed 0 (never) or 1 to 86400 s")
        if not isinstance(self.host, str) or not self.host or len(self.host) > 253 or any(c.isspace() for c in self.host):
            raise ValueError(f"controller.host={self.host!r}: allowed a host name or address")
        if self.advertise is not None and (not isinstance(self.advertise, str) or not self.advertise
                                           or len(self.advertise) > 253 or any(c.isspace() for c in self.advertise)):
            raise ValueError(f"controller.advertise={self.advertise!r}: allowed a host name or address")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65534:
            raise ValueError(f"controller.port={self.port!r}: allowed 0 (any free port) to 65534")
        if self.on_join not in JOIN_POLICIES:
            raise ValueError(f"controller.on_join={self.on_join!r}: allowed {', '.join(map(repr, JOIN_POLICIES))}")
        if isinstance(self.agent_timeout_s, bool) or not 1 <= self.agent_timeout_s <= 3600:
            raise ValueError(f"controller.agent_timeout_s={self.agent_timeout_s!r}: allowed 1 to 3600 s")
        if isinstance(self.syncs_per_s, bool) or not 10 <= self.syncs_per_s <= 1e6:
            raise ValueError(f"controller.syncs_per_s={self.syncs_per_s!r}: allowed 10 to 1000000")
        if not isinstance(self.long_poll, bool):
            raise ValueError(f"controller.long_poll={self.long_poll!r}: allowed true or false")
        if self.memory_gib is not None and not 0 < self.memory_gib < 1 << 20:
            raise ValueError(f"controller.memory_gib={self.memory_gib!r}: allowed a positive size in GiB")
