"""The rank guard: run a rank's Python program, and end the whole job if the program fails.

Without it, a rank whose script raises runs ``MPI_Finalize`` on its way out and waits there for
ranks that wait for it in a collective: the job hangs. ``ringtrain-run`` starts Python ranks as
``python -m ringtrain.runner.guard script.py ...``; on an uncaught exception or a non-zero
``sys.exit`` the guard prints which rank on which host failed and calls ``MPI_Abort``.
With ``--announce`` first, the guard also prints a line saying that its rank has started,
which ``ringtrain-run --start-timeout`` waits for. In an elastic launch the guard counts the
launcher's notices of new hosts from the start (``notices``), and lets ranks that stop at a
commit for them exit with ``notices.RESTART_STATUS`` without ending the job as failed.
"""

import os
import re
import runpy
import socket
import sys
import time

from ringtrain import settings
from ringtrain.runner import notices

_GUARD = ["-m", "ringtrain.runner.guard"]
_ANNOUNCE = "--announce"
_STARTED_LINE = "@@ringtrain-run: rank {} started@@"
STARTED = re.compile(re.escape(_STARTED_LINE).replace(r"\{\}", r"(\d+)").encode())
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_FLAGS = re.compile(r"-[bBdEiIOPqsSuvx]+|-[WX].+")  # interpreter options that stand alone

_FORWARD_SECONDS = 0.5  # time for the failure message to reach mpirun before the abort


def guarded(command: list[str], announce: bool = False) -> list[str]:
    """Return ``command`` with the guard put in front of its script, if it is a Python command.

    ``python [options] script.py args``, ``python [options] -m module args`` and
    ``python [options] -c code args`` are guarded; anything else is returned unchanged.
    With ``announce``, each rank prints a line that ``STARTED`` matches before the script runs.
    """
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return list(command)
    index = 1
    while index < len(command):
        arg = command[index]
        if arg in ("-m", "-c") or not arg.startswith("-"):
            guard = [*_GUARD, _ANNOUNCE] if announce else _GUARD
            return command[:index] + guard + command[index:]
        if arg in ("-W", "-X"):
            index += 2
        elif _FLAGS.fullmatch(arg):
            index += 1
        else:
            break
    return list(command)


def main(argv: list[str] | None = None) -> None:
    """Run ``script.py args``, ``-m module args`` or ``-c code args`` as Python would."""
    args = sys.argv[1:] if argv is None else argv
    announce = args[:1] == [_ANNOUNCE]
    if announce:
        args = args[1:]
    elastic = settings.elastic_launch().directory is not None
    if elastic:
        notices.install()  # before the start line: the launcher notifies only started ranks
    if announce:
        print(_STARTED_LINE.format(_rank_from_environment()), flush=True)
    try:
        _run(args)
    except SystemExit as exc:
        status = _exit_status(exc.code)
        if not status or (elastic and status == notices.RESTART_STATUS):
            raise
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        _abort(status, f"exited with status {status}")
    except BaseException as exc:
        trimmed = _user_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        _abort(1, f"raised {type(exc).__name__}: {exc}")


def _run(args):
    if not args:
        raise SystemExit("usage: python -m ringtrain.runner.guard script.py|-m module|-c code ...")
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def _exit_status(code):
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _user_traceback(tb):
    while tb is not None and (
        tb.tb_frame.f_globals is globals() or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    return tb


def _abort(status, what):
    mpi = sys.modules.get("mpi4py.MPI")
    live = mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
    rank = mpi.COMM_WORLD.Get_rank() if live else _rank_from_environment()
    print(
        f"ringtrain-run: rank {rank} on host {socket.gethostname()} {what}; ending the job",
        file=sys.stderr,
        flush=True,
    )
    if live:
        # Output reaches mpirun through its daemons, asynchronously; MPI_Abort tears them
        # down at once, which on a loaded machine lost this very message. Give it a moment.
        time.sleep(_FORWARD_SECONDS)
        mpi.COMM_WORLD.Abort(status)
    raise SystemExit(status)


def _rank_from_environment():
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "?"


if __name__ == "__main__":
    main()
