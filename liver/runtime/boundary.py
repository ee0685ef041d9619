"""The worker's decision at an iteration boundary, as a pure function of the consistent cut (the
same on every rank) and of what this rank's companion has done; ``Member.boundary`` carries it out.

Two decisions need a second step, each again pure: a deadline's forced preparation is followed
by a second cut (``after_force``), and a proposed switch by rank 0's compare-and-set on the
decision key, confirmed to every rank (``protocol.cut.confirm``): the controller may have
withdrawn the generation first.
"""

from __future__ import annotations

from dataclasses import dataclass

from liver.protocol.cut import Cut


@dataclass(frozen=True, slots=True)
class Local:
    """What this rank knows at the boundary, besides the cut."""

    step: int                 # the step just finished
    generation: int           # its Active World's
    preparing: int = 0        # the generation its companion prepares (0: none)
    built: bool = False       # the companion built that generation's groups
    ready: bool = False       # ... and connected them (first collectives): it reported ready
    defer_connect: bool = False  # the groups' first collectives wait for a boundary (connect = "boundary")
    checkpoint_due: bool = False
    precopied: int = 0        # slices of its pre-copy whose copy has begun (``Cut.precopy_slices``: how many)


@dataclass(frozen=True, slots=True)
class Action:
    stop: bool = False        # restart mode: save a checkpoint here and stop
    end_at: int = 0           # the controller ends the job after this step (0: not now)
    abandon: bool = False     # drop the companion's preparation (cancelled or superseded)
    prepare: int = 0          # start preparing this generation
    force: bool = False       # a deadline: finish preparing in the foreground, then ``after_force``
    connect: bool = False        # connect the built groups now, every member together
    precopy: bool = False     # every rank is ready: copy the next slice of the pre-copy beside the next step
    propose: int = 0          # every rank is ready for this generation: propose the switch
    checkpoint: bool = False  # start a periodic checkpoint


def decide(cut: Cut, me: Local) -> Action:
    if cut.stop_at and me.step >= cut.stop_at:
        return Action(stop=True)
    abandon = bool(me.preparing) and cut.wanted != me.preparing
    preparing = 0 if abandon else me.preparing
    prepare = force = connect = False
    if not preparing:
        prepare = cut.wanted > me.generation
    elif cut.force == preparing and not cut.switch_to:
        force = True
    elif me.defer_connect and me.built and not me.ready and cut.connect_now == preparing:
        connect = True
    # not while any rank still writes a periodic checkpoint over the Active World's groups (the
    # switch lets go of them; the write finishes within a few boundaries); a deadline's forced
    # switch does not wait (``after_force``: the write is abandoned)
    switchable = bool(preparing) and not force and cut.switch_to == preparing
    # a pre-copy copies a slice at each boundary before the switch; a deadline does not wait for it
    precopy = switchable and me.precopied < cut.precopy_slices and cut.force != preparing
    propose = preparing if switchable and not precopy and not cut.ckpt_busy else 0
    # never while the state is handed over, nor while any rank still writes the last one; a forced
    # boundary decides it after its second cut
    checkpoint = me.checkpoint_due and not cut.ckpt_busy and not propose and not force
    return Action(end_at=cut.end_at, abandon=abandon, prepare=cut.wanted if prepare else 0, force=force,
                  connect=connect, precopy=precopy, propose=propose, checkpoint=checkpoint)


def after_force(second: Cut, preparing: int, checkpoint_due: bool, ckpt_busy: bool) -> Action:
    """After a forced preparation: ``second`` is the cut of every rank's readiness alone (the
    controller's wish is the one of the first cut: ``preparing`` is still wanted)."""
    ready = second.ready_min == second.ready_max == preparing
    propose = preparing if ready else 0
    return Action(propose=propose, checkpoint=checkpoint_due and not ckpt_busy and not propose)
