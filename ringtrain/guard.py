"""The rank guard: run a rank's Python program, and end the whole job if the program fails.

Without it, a rank whose script raises runs ``MPI_Finalize`` on its way out and waits there for
ranks that wait for it in a collective: the job hangs. ``ringtrain-run`` starts Python ranks as
``python -m ringtrain.guard script.py ...`` (``contract.GUARD_MODULE``); on an uncaught
exception or a non-zero ``sys.exit`` the guard prints which rank on which host failed and calls
``MPI_Abort``. With ``--announce`` first, the guard also prints a line saying that its rank has
started (``contract.started_line``), which ``ringtrain-run --start-timeout`` waits for. In an
elastic launch the guard counts the launcher's notices of new hosts from the start
(``ringtrain.elastic.notices``), and lets ranks that stop at a commit for them exit with
``contract.RESTART_STATUS`` without ending the job as failed.
"""

import os
import runpy
import socket
import sys
import time

from ringtrain import contract, settings
from ringtrain.elastic import notices

_FORWARD_SECONDS = 0.5  # time for the failure message to reach mpirun before the abort


def main(argv: list[str] | None = None) -> None:
    """Run ``script.py args``, ``-m module args`` or ``-c code args`` as Python would."""
    args = sys.argv[1:] if argv is None else argv
    announce = args[:1] == [contract.ANNOUNCE]
    if announce:
        args = args[1:]
    elastic = settings.elastic_launch().directory is not None
    if elastic:
        # Before the start line: the launcher notifies only the ranks that have started.
        notices.counter().install()
    if announce:
        print(contract.started_line(_rank_from_environment()), flush=True)
    try:
        _run(args)
    except SystemExit as exc:
        status = _exit_status(exc.code)
        if not status or (elastic and status == contract.RESTART_STATUS):
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
        raise SystemExit(
            f"usage: python -m {contract.GUARD_MODULE} script.py|-m module|-c code ..."
        )
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
    print(contract.failed_line(rank, socket.gethostname(), what), file=sys.stderr, flush=True)
    if live:
        # Output reaches mpirun through its daemons, asynchronously; MPI_Abort tears them
        # down at once, which on a loaded machine lost this very message. Give it a moment.
        time.sleep(_FORWARD_SECONDS)
        mpi.COMM_WORLD.Abort(status)
    raise SystemExit(status)


def _rank_from_environment():
    for name in contract.RANK_VARIABLES:
        if name in os.environ:
            return os.environ[name]
    return "?"


if __name__ == "__main__":
    main()
