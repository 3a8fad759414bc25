"""Watch a job: relay mpirun's output, note what ranks say in it, end the job if ranks are late.

Ranks say they have started through the rank guard (``contract.ANNOUNCE``), whose line
comes back through mpirun's standard output; the watchdog removes those lines from what it
relays. It also reads mpirun's standard error for the lines of ranks that failed or found a
peer unreachable (``contract.FAILED``, ``contract.UNREACHABLE``): mpirun that cannot end a
job on a host that is cut off is killed ``ABORT_GRACE_SECONDS`` after such a line.

PRRTE's own ``--spawn-timeout`` does not cover daemons that never start (an ssh that hangs
at a prompt, say), and prterun ignores SIGTERM and SIGINT while it waits for them, so the
watchdog kills mpirun and its children itself.
"""

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ringtrain import contract

TIMED_OUT = 124  # the exit status when ranks did not start in time, as timeout(1) uses


# After a rank reports a peer that stopped answering, mpirun has this long to end the job;
# prterun waits for a daemon on a host that is cut off until TCP gives up (many minutes).
ABORT_GRACE_SECONDS = 10.0


@dataclasses.dataclass
class Heard:
    """What a launch's ranks said in the contract's lines: the ranks started, failed, lost.

    ``lost_at``: when the first line about a peer that stopped answering came.
    """

    started: set[int] = dataclasses.field(default_factory=set)
    failed: set[int] = dataclasses.field(default_factory=set)
    unreachable: set[int] = dataclasses.field(default_factory=set)
    lost_at: float | None = dataclasses.field(default=None, compare=False)

    def note(self, line: bytes) -> bool:
        """Note ``line`` if it is one of the contract's; return True if it is not for people."""
        for pattern, ranks, hidden in (
            (contract.STARTED, self.started, True),
            (contract.UNREACHABLE, self.unreachable, True),
            (contract.FAILED, self.failed, False),
        ):
            found = pattern.search(line)
            if found:
                ranks.add(int(found[1]))
                if ranks is self.unreachable and self.lost_at is None:
                    self.lost_at = time.monotonic()
                return hidden
        return False


def end_if_stuck(proc, heard: Heard) -> bool:
    """Kill mpirun and its children if it outlives a lost peer by ABORT_GRACE_SECONDS.

    Returns True if it did (after saying so).
    """
    lost = heard.lost_at
    if lost is None or time.monotonic() - lost < ABORT_GRACE_SECONDS or proc.poll() is not None:
        return False
    ranks = ", ".join(map(str, sorted(heard.unreachable)))
    _end(
        proc,
        f"rank(s) {ranks} stopped answering, and mpirun had not ended the job "
        f"{ABORT_GRACE_SECONDS:g} s later; killing it",
    )
    return True


def supervise(
    argv: list[str], num_proc: int, timeout: float | None, where: Callable[[int], str]
) -> int:
    """Run ``argv`` and relay its output; return its exit status.

    Ends the job, and returns TIMED_OUT, if ranks have not all started within ``timeout``
    seconds (None: no limit); ends it, and returns 1, if mpirun outlives a lost peer
    (``end_if_stuck``). ``where(rank)`` names the host of a rank for the message about
    ranks that did not start.
    """
    heard = Heard()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        previous = {sig: signal.signal(sig, _handler(proc, sig)) for sig in _HANDLED}
        pipes = (proc.stdout.fileno(), proc.stderr.fileno(), heard)
        relay = threading.Thread(target=relay_noting, args=pipes, daemon=True)
        relay.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not _ended(proc):
                if end_if_stuck(proc, heard):
                    relay.join()
                    return 1
                late = deadline is not None and time.monotonic() > deadline
                if late and len(heard.started) < num_proc:
                    missing = sorted(set(range(num_proc)) - heard.started)
                    _end(
                        proc,
                        f"{_describe(missing, where)} did not start within {timeout:g} s; "
                        "ending the job",
                    )
                    relay.join()
                    return TIMED_OUT
            relay.join()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    status = proc.returncode
    return 128 - status if status < 0 else status


def _end(proc, why: str) -> None:
    """Say ``why`` the launcher ends the job, then kill mpirun and its children."""
    print(f"ringtrain-run: {why}", file=sys.stderr, flush=True)
    _kill_tree(proc.pid)
    proc.wait()


def _ended(proc, seconds=0.2):
    """Return True once ``proc`` has ended, waiting up to ``seconds`` for it."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


# mpirun shares the runner's process group, so a SIGINT from the terminal reaches it directly:
# the runner only keeps relaying until mpirun ends. SIGTERM and SIGHUP are passed on.
_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _handler(proc, sig):
    if sig == signal.SIGINT:
        return lambda signum, frame: None
    return lambda signum, frame: proc.send_signal(signum)


def relay_noting(stdout: int, stderr: int, heard: Heard) -> None:
    """Relay the ``stdout`` and ``stderr`` pipes to ours until both close, noting in ``heard``.

    Lines that are not for people (``Heard.note``) are noted and not relayed.
    """
    streams = {stdout: sys.stdout, stderr: sys.stderr}
    pending = dict.fromkeys(streams, b"")
    while streams:
        ready, _, _ = select.select(list(streams), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                pending[fd] = _relay_lines(pending[fd] + chunk, heard, streams[fd])
            else:
                _write(pending[fd], streams.pop(fd))


def _relay_lines(data, heard, stream):
    """Relay ``data``'s whole lines to ``stream`` but those ``heard`` keeps; return the rest."""
    *lines, pending = data.split(b"\n")
    for line in lines:
        if not heard.note(line):
            _write(line + b"\n", stream)
    return pending


def _write(data, stream):
    try:
        stream.buffer.write(data)
        stream.buffer.flush()
    except BrokenPipeError:
        pass


def _describe(missing, where):
    by_host = {}
    for rank in missing:
        by_host.setdefault(where(rank), []).append(str(rank))
    parts = [
        f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(r)} on {h}" for h, r in by_host.items()
    ]
    return "; ".join(parts)


def _kill_tree(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                    parent = int(file.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    doomed, todo = [], [pid]
    while todo:
        doomed.append(todo.pop())
        todo.extend(children.get(doomed[-1], []))
    for victim in doomed:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
