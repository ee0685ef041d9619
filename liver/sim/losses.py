"""Which GPUs a loss takes, where the job runs on fewer than there are (the rest idle): a spot
trace or a synthetic regime gives counts, not nodes. A provider reclaims nodes without regard to
which ones a job uses, so the simulator draws them at random (``RandomNodes``, its default); the
two bounds are subclasses: ``IdleFirst`` (a loss takes idle nodes before the job's: the best case,
and the simulator's rule before it drew) and ``JobFirst`` (the job's before idle ones: the worst).

Each answers how many of the job's GPUs a loss takes: the controller then takes the loss as a
node's notice (its ranks leave; idle GPUs are not drawn in), a loss of idle GPUs only costs nothing.
"""

from __future__ import annotations

import random


class Takes:
    """Which nodes a loss takes: ``job_lost`` the GPUs of the job's ``used`` that go when the
    count falls from ``before`` to ``after`` (nodes of ``node`` GPUs; single GPUs where a count
    is no whole number of nodes); ``key`` names the change (its draws are its own, the same for
    every policy)."""

    def job_lost(self, before: int, after: int, used: int, node: int, key: str) -> int:
        size = node if before % node == 0 and after % node == 0 else 1
        nodes, mine = before // size, -(-used // size)
        hits = self.nodes_hit(nodes, mine, (before - after) // size, key)
        return min(used, hits * size)

    def nodes_hit(self, nodes: int, mine: int, lost: int, key: str) -> int:
        """Of ``lost`` nodes out of ``nodes``, how many are among the job's ``mine``."""
        raise NotImplementedError


class RandomNodes(Takes):
    """Each lost node drawn at random from those left (a hypergeometric draw), seeded by
    ``seed`` and the change."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def nodes_hit(self, nodes: int, mine: int, lost: int, key: str) -> int:
        rng, hits = random.Random(f"{self.seed}:{key}"), 0
        for drawn in range(lost):
            if rng.random() * (nodes - drawn) < mine - hits:
                hits += 1
        return hits


class IdleFirst(Takes):
    def nodes_hit(self, nodes: int, mine: int, lost: int, key: str) -> int:
        return max(0, lost - (nodes - mine))


class JobFirst(Takes):
    def nodes_hit(self, nodes: int, mine: int, lost: int, key: str) -> int:
        return min(lost, mine)


TAKES: dict[str, type[Takes]] = {"random": RandomNodes, "idle-first": IdleFirst, "job-first": JobFirst}


def named(name: str, seed: int = 0) -> Takes:
    """The way a loss takes nodes that ``--takes`` names (``seed``: the random draws'); ValueError
    naming the value and what is allowed."""
    if name not in TAKES:
        raise ValueError(f"--takes {name}: allowed {', '.join(TAKES)}")
    return RandomNodes(seed) if TAKES[name] is RandomNodes else TAKES[name]()
