"""Real launches of ``ringtrain-run`` on this machine: exit status, dead ranks, settings."""

import os
import re
import socket
import sys
from pathlib import Path

import pytest
from multihost import bounded

REPO = Path(__file__).resolve().parent.parent
FAILING_RANK = str(REPO / "tests/multihost/failing_rank.py")
DEADLINE = 30  # seconds within which a dead rank must have ended the whole job


def _launch(tmp_path, *args, timeout=90):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    argv = [sys.executable, "-m", "ringtrain.runner", *args]
    return bounded.run(argv, timeout, cwd=tmp_path, env=env)


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
