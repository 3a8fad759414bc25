"""Real launches of ``ringtrain-run`` on this machine: exit status, dead ranks, settings."""

import os
import re
import socket
import sys
from pathlib import Path

import pytest
from mpi_launch import launch

pytestmark = pytest.mark.mpi

REPO = Path(__file__).resolve().parent.parent
FAILING_RANK = str(REPO / "tests/multihost/failing_rank.py")
DEADLINE = 30  # seconds within which a dead rank must have ended the whole job


def _launch(tmp_path, *args, timeout=90):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    argv = [sys.executable, "-m", "ringtrain.runner", *args]
    return launch(argv, timeout, cwd=tmp_path, env=env)


def test_job_exits_zero_with_tagged_output(tmp_path):
    done, _ = _launch(tmp_path, "-np", "2", sys.executable, FAILING_RANK, "none", "0")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>: rank {rank} on {socket.gethostname()} finished, sum 1" in (
            done.stdout
        )


def test_exit_status_of_a_rank_is_the_jobs(tmp_path):
    done, took = _launch(tmp_path, "-np", "2", sys.executable, FAILING_RANK, "exit", "1", "3")
    assert done.returncode == 3, done.stderr
    assert f"rank 1 on host {socket.gethostname()} exited with status 3" in done.stderr
    assert took < DEADLINE


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("raise", 1, r"rank 1 on host {host} raised RuntimeError: failing on purpose"),
        ("kill", 128 + 9, r"process rank 1 with PID \d+ on node {host} exited on\s+signal 9"),
        ("segv", 128 + 11, r"process rank 1 with PID \d+ on node {host} exited on\s+signal 11"),
    ],
    ids=["raised", "killed", "crashed"],
)
def test_a_dead_rank_ends_the_job(tmp_path, mode, status, message):
    done, took = _launch(tmp_path, "-np", "2", sys.executable, FAILING_RANK, mode, "1")
    assert done.returncode == status, done.stderr
    assert re.search(message.format(host=re.escape(socket.gethostname())), done.stderr), done.stderr
    assert took < DEADLINE


def test_start_timeout_relays_output_without_the_start_lines(tmp_path):
    done, _ = _launch(
        tmp_path, "--start-timeout", "60", "-np", "2", sys.executable, FAILING_RANK, "none", "0"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[1,{rank}]<stdout>: rank {rank} on {socket.gethostname()} finished, sum 1"
        for rank in (0, 1)
    ]


def test_ranks_that_do_not_start_in_time_end_the_job(tmp_path):
    hanging = tmp_path / "hanging-agent.sh"
    hanging.write_text("#!/bin/sh\nexec sleep 300\n")
    hanging.chmod(0o755)
    done, took = _launch(
        tmp_path,
        "--start-timeout", "3", "-np", "2", "-H", "localhost:1,unreachable-test-host:1",
        "--mpi-args", f"--prtemca plm_ssh_agent {hanging}",
        sys.executable, FAILING_RANK, "none", "0",
    )  # fmt: skip
    assert done.returncode == 124, done.stderr
    assert (
        "ringtrain-run: rank 0 on localhost; rank 1 on unreachable-test-host did not start "
        "within 3 s; ending the job"
    ) in done.stderr
    assert took < DEADLINE
    assert not _processes_mentioning(str(tmp_path)), "the hanging agent was left running"


def test_a_failed_launch_keeps_mpiruns_status_under_the_watchdog(tmp_path):
    done, took = _launch(
        tmp_path,
        "--start-timeout", "60", "-np", "2", "-H", "localhost:1,unreachable-test-host:1",
        "--mpi-args", "--prtemca plm_ssh_agent false",
        sys.executable, FAILING_RANK, "none", "0",
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode not in (0, 124), output
    assert "did not start" not in output and "daemon failed to report back" in output
    assert took < DEADLINE


def _processes_mentioning(text):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if text.encode() in file.read():
                    found.append(entry)
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
    return found


def test_settings_reach_every_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGTRAIN_CYCLE_TIME", "3.5")
    show = (
        "import os; e = os.environ; print(e['RINGTRAIN_FUSION_THRESHOLD'], "
        "e['RINGTRAIN_CYCLE_TIME'])"
    )
    done, _ = _launch(
        tmp_path, "--fusion-threshold-mb", "2", "-np", "2", sys.executable, "-c", show
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "[1,0]<stdout>: 2097152 3.5",
        "[1,1]<stdout>: 2097152 3.5",
    ]
