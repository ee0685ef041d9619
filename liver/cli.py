"""The ``liver`` command line: each family of commands registers its own (``add_parsers``) and
imports what it uses when it runs; a command that only talks to a running job (``status``,
``scale``, ``queue``, ``stop``) imports no torch."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from liver.agent import commands as agent_commands
from liver.bench import commands as bench_commands
from liver.controller import client, commands as job_commands
from liver.data import commands as data_commands
from liver.sim import commands as sim_commands

# in the order `liver --help` lists them
FAMILIES = (job_commands, agent_commands, client, data_commands, sim_commands, bench_commands)


def parser() -> argparse.ArgumentParser:
    """Every command's flags, each family's registered by the family."""
    p = argparse.ArgumentParser(prog="liver", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for family in FAMILIES:
        family.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"liver: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the job could not go on (ControllerError)
        print(f"liver: job failed: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # before the job started, or after it ended
        print("liver: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The ``liver`` command: ``main``, then the process ends at once. An interpreter that imported
    torch spends over a second tearing its modules down after the last line (timed here: 1.25 s);
    whatever a command leaves to finish (its children, its store) it ends itself before it returns,
    so only the output is flushed. ``kill -USR1 PID``: every thread's stack to stderr (a job that
    seems stuck, as its workers do)."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    entry()
