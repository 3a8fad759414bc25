"""Watch a job start: relay mpirun's output and end the job if a rank does not start in time.

Ranks say they have started through the rank guard (``contract.ANNOUNCE``), whose line
comes back through mpirun's standard output; the watchdog removes those lines from what it
relays. PRRTE's own ``--spawn-timeout`` does not cover daemons that never start (an ssh that
hangs at a prompt, say), and prterun ignores SIGTERM and SIGINT while it waits for them, so
the watchdog kills mpirun and its children itself.
"""

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from ringtrain import contract

TIMED_OUT = 124  # the exit status when ranks did not start in time, as timeout(1) uses


def supervise(argv: list[str], num_proc: int, timeout: float, where: Callable[[int], str]) -> int:
    """Run ``argv``; return its exit status, or TIMED_OUT after killing it if ranks are late.

    ``where(rank)`` names the host of a rank for the message about ranks that did not start.
    """
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        previous = {sig: signal.signal(sig, _handler(proc, sig)) for sig in _HANDLED}
        try:
            started, late = _relay_until_started(proc.stdout.fileno(), num_proc, timeout)
            if late:
                missing = sorted(set(range(num_proc)) - started)
                print(
                    f"ringtrain-run: {_describe(missing, where)} did not start within "
                    f"{timeout:g} s; ending the job",
                    file=sys.stderr,
                    flush=True,
                )
                _kill_tree(proc.pid)
                proc.wait()
                return TIMED_OUT
            _relay(proc.stdout.fileno())
            status = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 128 - status if status < 0 else status


# mpirun shares the runner's process group, so a SIGINT from the terminal reaches it directly:
# the runner only keeps relaying until mpirun ends. SIGTERM and SIGHUP are passed on.
_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _handler(proc, sig):
    if sig == signal.SIGINT:
        return lambda signum, frame: None
    return lambda signum, frame: proc.send_signal(signum)


def _relay_until_started(fd, num_proc, timeout):
    started = set()
    pending = b""
    deadline = time.monotonic() + timeout
    late = False
    while len(started) < num_proc:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        late = not ready
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            break
        pending = _relay_lines(pending + chunk, started)
    _write(pending)
    return started, late


def relay_noting_starts(fd: int, started: set[int]) -> None:
    """Relay ``fd`` to standard output until it closes, but for ranks' start lines.

    The rank of each start line goes into ``started`` instead, as it comes.
    """
    pending = b""
    while chunk := os.read(fd, 65536):
        pending = _relay_lines(pending + chunk, started)
    _write(pending)


def _relay_lines(data, started):
    """Relay the whole lines of ``data`` but start lines, noted in ``started``; return the rest."""
    *lines, pending = data.split(b"\n")
    for line in lines:
        found = contract.STARTED.search(line)
        if found:
            started.add(int(found[1]))
        else:
            _write(line + b"\n")
    return pending


def _relay(fd):
    while chunk := os.read(fd, 65536):
        _write(chunk)


def _write(data):
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
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
