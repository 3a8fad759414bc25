"""``ringtrain-run --hostfile`` across test hosts made of network namespaces, over TCP.

Three hosts (2, 1 and 1 slots) get their own network namespace, address in 10.231.0.0/24 and
hostname (see ``multihost/netns_cluster.py``); Open MPI reaches them through a remote-shell
agent instead of ssh. Needs root and ``ip`` (iproute2); skipped where namespaces cannot be made.
"""

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mpi_launch import launch
from multihost import netns_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent / "elastic"))
import discovery  # noqa: E402 - next to the elastic job it serves
import replay  # noqa: E402 - next to the elastic job it checks

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests/multihost"
ELASTIC_JOB = REPO / "tests/elastic/numpy_job.py"
# No other test's job runs beside these (tests/conftest.py), on one worker.
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("alone")]
SLOTS = [2, 1, 1]
DEADLINE = 30  # seconds within which a dead rank must have ended the whole job
TIMEOUT = 5  # RINGTRAIN_COLLECTIVE_TIMEOUT of the tests whose host stops answering


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Make the namespace hosts and a hostfile naming them; remove them whatever happens."""
    reason = netns_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    with netns_cluster.cluster(len(SLOTS)) as hosts:
        hostfile = tmp_path_factory.mktemp("multihost") / "hosts"
        hostfile.write_text(
            "".join(f"{name} slots={slots}\n" for name, slots in zip(hosts, SLOTS, strict=True))
        )
        yield list(hosts), hostfile


_MPI_ARGS = [
    *("--prtemca", "plm_ssh_agent", netns_cluster.agent()),
    # the test hosts share this machine's cores: ranks waiting in MPI must yield them
    *("--mca", "mpi_yield_when_idle", "1"),
]


def _launch(cluster, *command, options=(), settings=None, where=None, timeout=120):
    names, hostfile = cluster
    where = where or ["-np", str(sum(SLOTS)), "--hostfile", str(hostfile), "--start-timeout", "60"]
    runner = [
        sys.executable, "-m", "ringtrain.runner", *where,
        "--network-interface", netns_cluster.SUBNET, "--mpi-args", shlex.join(_MPI_ARGS),
        *options, sys.executable, *command,
    ]  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    env.update(settings or {})
    return launch(netns_cluster.on_host(names[0], runner), timeout, cwd=hostfile.parent, env=env)


@pytest.mark.parametrize(
    ("options", "settings"),
    [
        ((), {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "0"}),  # the flat ring, through the launcher
        (("--hierarchical-allreduce",), {}),
        ((), {}),  # the default: hierarchical here, as the job spans hosts
    ],
    ids=["flat", "hierarchical", "default"],
)
def test_allreduce_and_training_across_hosts(cluster, options, settings):
    names, _ = cluster
    layout = ",".join(f"{name}:{slots}" for name, slots in zip(names, SLOTS, strict=True))
    done, _ = _launch(
        cluster, str(SCRIPTS / "train_check.py"), layout, options=options, settings=settings
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    passed = re.findall(r"rank (\d) on (\S+): all checks passed", done.stdout)
    placed = [name for name, slots in zip(names, SLOTS, strict=True) for _ in range(slots)]
    assert sorted(passed) == [(str(rank), name) for rank, name in enumerate(placed)]


@pytest.mark.parametrize(
    ("mode", "rank", "message"),
    [
        ("raise", 3, r"rank 3 on host {2} raised RuntimeError"),
        ("kill", 2, r"process rank 2 with PID \d+ on node {1} exited on\s+signal 9"),
    ],
    ids=["raised", "killed"],
)
def test_a_dead_rank_on_another_host_ends_the_job(cluster, mode, rank, message):
    names, _ = cluster
    done, took = _launch(cluster, str(SCRIPTS / "failing_rank.py"), mode, str(rank))
    assert done.returncode != 0
    assert re.search(message.format(*names), done.stderr), done.stderr
    assert took < DEADLINE


def test_an_elastic_job_grows_onto_other_hosts_and_survives_a_crash_there(cluster, tmp_path):
    """Grown from 2 ranks on one host to 4 on three at step 8; rank 3 dies at step 40."""
    names, _ = cluster
    script = discovery.script(tmp_path, f"{names[0]}:2")
    grown = ",".join(f"{name}:{slots}" for name, slots in zip(names, SLOTS, strict=True))
    done, _ = _launch(
        cluster,
        str(ELASTIC_JOB),
        where=["-np", "2", "--max-np", "4", "--host-discovery-script", script],
        settings={
            "ELASTIC_STEPS": "120",
            "ELASTIC_COMMIT_EVERY": "5",
            "ELASTIC_OUT": str(tmp_path / "out.json"),
            "ELASTIC_HOSTS": f"0:8:{tmp_path / 'hosts'}:{grown}",
            "ELASTIC_SLOW": "0.05",
            "ELASTIC_CRASH": "1:40:3",
        },
        timeout=240,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "the ranks stopped at a commit for the new hosts; relaunching" in done.stderr
    assert f"generation 1: 4 ranks on {grown.replace(',', ', ')}" in done.stderr
    assert "the job failed (exit status 3); relaunching from its last commit" in done.stderr
    result = replay.checked_result(tmp_path / "out.json", 120)
    sizes = [size for _, size, _ in result["history"]]
    switch = sizes.index(4)
    assert switch > 8 and switch % 5 == 0
    assert sizes == [2] * switch + [4] * (120 - switch)
    launches = [launch for _, _, launch in result["history"]]
    assert launches == ["0"] * switch + ["1"] * (40 - switch) + ["2"] * 80
    assert result["resets"] == [4]


@pytest.mark.parametrize("mode", ["stop", "stop-mid", "down", "drop"])
def test_a_host_that_stops_answering_ends_the_job_naming_it(cluster, mode):
    """Rank 3, alone on the third host, freezes or loses its link at step 3 of 200.

    ``stop`` freezes it before it submits step 3, ``stop-mid`` while step 3's 32 MiB
    cross the links.
    """
    names, _ = cluster
    try:
        done, _ = _launch(
            cluster,
            str(SCRIPTS / "stalled_peer.py"), mode, "3", "200", "32",
            settings={"RINGTRAIN_COLLECTIVE_TIMEOUT": str(TIMEOUT)},
        )  # fmt: skip
        ended = time.time()
    finally:  # the host's link comes back for the next test
        subprocess.run(["ip", "-n", names[2], "link", "set", "eth0", "up"], timeout=20)
        route = ["ip", "-n", names[2], "route", "replace", netns_cluster.SUBNET, "dev", "eth0"]
        subprocess.run(route, timeout=20)
    assert done.returncode != 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    fault = re.search(rf"rank 3 on {names[2]}: {mode} at ([\d.]+)", done.stdout)
    assert fault, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert ended - float(fault[1]) < TIMEOUT + 30, f"ended {ended - float(fault[1]):.1f} s after"
    # Whoever waited for it names it: in a transfer, or in the negotiation (heard nothing), or
    # behind a rank it named first, which answered (gave up in turn) while rank 3 never did.
    lost = rf"rank 3 on {names[2]}"
    found = rf"((waited \d+ s for|heard nothing from) {lost}|{lost}, waited for in turn, never)"
    assert re.search(rf"ringtrain: error: rank \d on \S+.* {found}", done.stderr), done.stderr
    for rank in range(3):  # and every other rank says why it gives up, naming rank 3
        assert re.search(rf"ringtrain: error: rank {rank} on \S+ .*{lost}", done.stderr), (
            rank,
            done.stderr,
        )
    assert not _left_running(names, "stalled_peer.py")


def test_a_slow_but_moving_transfer_does_not_trip_the_timeout(cluster):
    """Links of 20 Mbit/s: each 16 MiB allreduce takes about 9 s, each 1 MiB chunk 0.4 s."""
    names, _ = cluster
    for name in names:
        _tc(
            name,
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            "20mbit",
            "burst",
            "64kb",
            "latency",
            "2s",
        )  # fmt: skip (a queue long enough that TCP loses nothing)
    try:
        done, _ = _launch(
            cluster,
            str(SCRIPTS / "stalled_peer.py"), "none", "0", "2", "16",
            settings={"RINGTRAIN_COLLECTIVE_TIMEOUT": str(TIMEOUT)},
        )  # fmt: skip
    finally:
        for name in names:
            _tc(name, "del", "dev", "eth0", "root")
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert len(re.findall(r"all 2 steps right", done.stdout)) == sum(SLOTS)


def _tc(host, *args, check=True):
    command = ["ip", "netns", "exec", host, "tc", "qdisc", *args]
    subprocess.run(command, check=check, capture_output=not check, timeout=20)


def _left_running(names, script):
    """Return the processes running ``script`` in any of the hosts' namespaces."""
    left = []
    for name in names:
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=20
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(FileNotFoundError):
                if script in Path(f"/proc/{pid}/cmdline").read_text():
                    left.append((name, pid))
    return left


def test_an_elastic_job_goes_on_without_a_host_that_froze(cluster, tmp_path):
    """A host that froze is left out, and the job finishes from its last commit without it.

    Rank 3, alone on the third host, freezes at step 20 of 80: the job ends, and is
    relaunched on the other two hosts from step 20, ending as if uninterrupted (the replay).
    """
    names, _ = cluster
    every = ",".join(f"{name}:{slots}" for name, slots in zip(names, SLOTS, strict=True))
    script = discovery.script(tmp_path, every.replace(",", "\n"))
    done, _ = _launch(
        cluster,
        str(ELASTIC_JOB),
        where=["-np", "4", "--min-np", "2", "--host-discovery-script", script,
               "--blacklist-cooldown", "600"],
        settings={
            "RINGTRAIN_COLLECTIVE_TIMEOUT": str(TIMEOUT),
            "ELASTIC_STEPS": "80",
            "ELASTIC_COMMIT_EVERY": "5",
            "ELASTIC_OUT": str(tmp_path / "out.json"),
            "ELASTIC_FREEZE": "0:20:3",
        },
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert re.search(rf"rank 3 on {names[2]}", done.stderr), done.stderr
    assert f"host {names[2]} failed" in done.stderr, done.stderr
    assert f"generation 1: 3 ranks on {names[0]}:2, {names[1]}:1" in done.stderr
    result = replay.checked_result(tmp_path / "out.json", 80)
    sizes = [size for _, size, _ in result["history"]]
    assert sizes == [4] * 20 + [3] * 60
