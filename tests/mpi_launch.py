"""Run a script under a real ``mpirun`` with a timeout, so a hang fails instead of stalling."""

import os
import sys
from pathlib import Path

import bounded

from ringtrain.runner.locate import find_mpirun

SCRIPTS = Path(__file__).parent / "mpi"
# Now and then Open MPI 5's launcher fails to start its PMIx server, before any rank runs
# (once in some 600 launches of the suite here); such a launch is tried once more.
_LAUNCHER_FAILED = "The PMIx server's listener thread failed to start"


def run(script: str, np: int, *args, timeout: float = 120, env: dict | None = None, prefix=()):
    """Run tests/mpi/``script`` on ``np`` ranks; return the CompletedProcess (text output).

    ``prefix``: a command that each rank's Python starts under (``setpriv ...``).
    """
    command = [
        find_mpirun(),
        "-np", str(np),
        "--oversubscribe", "--bind-to", "none",
        *prefix, sys.executable, str(SCRIPTS / script), *map(str, args),
    ]  # fmt: skip
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(SCRIPTS.parent.parent), str(SCRIPTS), full_env.get("PYTHONPATH", "")]
    )
    full_env.update(env or {})
    return launch(command, timeout, env=full_env)[0]


def launch(command: list[str], timeout: float, **popen):
    """Run an MPI job's ``command`` with ``bounded.run``, and once more if the launcher failed.

    Returns what ``bounded.run`` returns for the launch that counted.
    """
    done = bounded.run(command, timeout, **popen)
    if done[0].returncode != 0 and _LAUNCHER_FAILED in done[0].stderr:
        sys.stderr.write(f"mpirun failed to start its PMIx server; launching {command} again\n")
        done = bounded.run(command, timeout, **popen)
    return done


def check(script: str, np: int, *args, timeout: float = 120, env: dict | None = None, prefix=()):
    """Run like ``run`` and fail the test, with the output, unless every rank exited 0."""
    result = run(script, np, *args, timeout=timeout, env=env, prefix=prefix)
    assert result.returncode == 0, (
        f"{script} on {np} ranks exited {result.returncode}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result
