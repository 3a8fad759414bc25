"""Run a command with a deadline: a hang kills its process group and fails with the output."""

import os
import signal
import subprocess
import time


def run(argv: list[str], timeout: float, **popen) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``argv`` to completion; return its CompletedProcess (text) and the seconds it took."""
    start = time.monotonic()
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(
                f"{argv} ran past {timeout} s\nstdout:\n{out}\nstderr:\n{err}"
            ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), time.monotonic() - start
