"""``ringtrain-run --hostfile`` across test hosts made of network namespaces, over TCP.

Three hosts (2, 1 and 1 slots) get their own network namespace, address in 10.231.0.0/24 and
hostname (see ``ringtrain/bench/netns.py``); Open MPI reaches them through a remote-shell
agent instead of ssh. Needs root and ``ip`` (iproute2); skipped where namespaces cannot be made.
"""

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import bounded
import pytest
from mpi_launch import launch

from ringtrain.bench import ceiling, netns
from ringtrain.bench import cluster as cluster_bench

sys.path.insert(0, str(Path(__file__).resolve().parent / "elastic"))
import discovery  # noqa: E402 - next to the elastic job it serves
import replay  # noqa: E402 - next to the elastic job it checks

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests/multihost"
CHECKS = REPO / "tests/mpi"
ELASTIC_JOB = REPO / "tests/elastic/numpy_job.py"
# No other test's job runs beside these (tests/conftest.py), on one worker.
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("alone"), pytest.mark.mpi]
SLOTS = [2, 1, 1]
DEADLINE = 30  # seconds within which a dead rank must have ended the whole job
TIMEOUT = 5  # RINGTRAIN_COLLECTIVE_TIMEOUT of the tests whose host stops answering
DAEMON_LOST = "A daemon failed to report back"  # Open MPI, before any rank starts
BENCH_PREFIX = "rtmhb"  # the namespaces of the cluster benchmark's own test hosts
GUARD = "ringtrain.guard"  # what ringtrain-run starts each rank under: python -m GUARD ...


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Make the namespace hosts and a hostfile naming them; remove them whatever happens."""
    reason = netns.why_unavailable()
    if reason:
        pytest.skip(reason)
    with netns.cluster(len(SLOTS)) as hosts:
        hostfile = tmp_path_factory.mktemp("multihost") / "hosts"
        hostfile.write_text(
            "".join(f"{name} slots={slots}\n" for name, slots in zip(hosts, SLOTS, strict=True))
        )
        yield list(hosts), hostfile


def _repo_env():
    """Return this environment with what ranks on the test hosts need (``cluster.rank_env``).

    The repository comes first on PYTHONPATH; ranks bind to cores as they would anywhere.
    """
    env = dict(os.environ, **cluster_bench.rank_env())
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env["PYTHONPATH"]])
    return env


def _launch(cluster, *command, options=(), settings=None, where=None, timeout=120):
    names, hostfile = cluster
    where = where or ["-np", str(sum(SLOTS)), "--hostfile", str(hostfile), "--start-timeout", "60"]
    runner = [
        sys.executable, "-m", "ringtrain.runner", *where,
        "--network-interface", netns.SUBNET, "--mpi-args", shlex.join(cluster_bench.mpi_args()),
        *options, sys.executable, *command,
    ]  # fmt: skip
    env = _repo_env()
    env.update(settings or {})
    start = functools.partial(
        launch, netns.on_host(names[0], runner), timeout, cwd=hostfile.parent, env=env
    )
    done, took = start()
    if done.returncode != 0 and DAEMON_LOST in done.stdout + done.stderr:
        # Open MPI's daemon on another test host failed to call back before any rank
        # started (seen once in CI under load, exit status 213): launch once more. A
        # failure after the ranks start is never retried.
        done, took = start()
    return done, took


def test_allreduce_and_training_across_hosts(cluster):
    """The default settings: the allreduce is hierarchical here, through each host's first rank.

    The flat ring across hosts is checked at 200 Mbit/s below, and what the launcher's
    --hierarchical-allreduce exports in test_runner.py.
    """
    names, _ = cluster
    layout = ",".join(f"{name}:{slots}" for name, slots in zip(names, SLOTS, strict=True))
    done, _ = _launch(cluster, str(SCRIPTS / "train_check.py"), layout)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    passed = re.findall(r"rank (\d) on (\S+): all checks passed", done.stdout)
    placed = [name for name, slots in zip(names, SLOTS, strict=True) for _ in range(slots)]
    assert sorted(passed) == [(str(rank), name) for rank, name in enumerate(placed)]


def test_two_hosts_of_two_ranks_finish_at_the_defaults_with_core_binding_on(cluster):
    """Ranks of both hosts run on this machine's two cores, and each waits in MPI's barriers.

    With binding by hostname, each host's ranks took a core each, and those of the other
    host the same ones: nine launches of nine hung (issue 42). Now the machine's ranks
    divide its cores together, so four ranks on two cores keep both.
    """
    names, _ = cluster
    where = ["-np", "4", "-H", f"{names[0]}:2,{names[1]}:2", "--start-timeout", "60"]
    done, _ = _launch(
        cluster,
        str(CHECKS / "check_shared_cores.py"),
        "default",  # its counts: 0, 1, uneven, 1 MiB and 16 MiB
        settings={"PYTHONPATH": os.pathsep.join([str(REPO), str(CHECKS)])},
        where=where,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    found = re.findall(r"rank \d on CPUs \[([\d, ]*)\]: every allreduce matched", done.stdout)
    cpus = [frozenset(map(int, text.split(","))) for text in found]
    assert len(cpus) == 4, done.stdout
    # One set for all (more ranks than cores, as here), or a share each that no other holds.
    shared = len(set(cpus)) == 1
    assert shared or sum(map(len, cpus)) == len(frozenset().union(*cpus)), cpus


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
    # The status is Open MPI's: rank 3's own (3) as a rule, but once in CI 213, cause unknown.
    failed = r"the job failed \(exit status (\d+)\); relaunching from its last commit"
    assert re.search(failed, done.stderr), done.stderr
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
        route = ["ip", "-n", names[2], "route", "replace", netns.SUBNET, "dev", "eth0"]
        subprocess.run(route, timeout=20)
    assert done.returncode != 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    fault = re.search(rf"rank 3 on {names[2]}: {mode} at ([\d.]+)", done.stdout)
    assert fault, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert ended - float(fault[1]) < TIMEOUT + 30, f"ended {ended - float(fault[1]):.1f} s after"
    # Whoever waited for it names it: in a transfer, or in the negotiation (heard nothing), or
    # behind a rank it named first, which answered (gave up in turn) while rank 3 never did.
    lost = rf"rank 3 on {names[2]}"
    found = rf"(?:(?:waited \d+ s for|heard nothing from) {lost}|{lost}, waited for in turn, never)"
    assert re.search(rf"ringtrain: error: rank \d on \S+.* {found}", done.stderr), done.stderr
    for rank in range(3):  # and every other rank says why it gives up, naming rank 3
        assert re.search(rf"ringtrain: error: rank {rank} on \S+ .*{lost}", done.stderr), (
            rank,
            done.stderr,
        )
    assert not _left_running(names, "stalled_peer.py")


def test_a_slow_but_moving_transfer_does_not_trip_the_timeout(cluster):
    """Links of 20 Mbit/s: a 16 MiB allreduce takes about 9 s, each of its chunks under 0.4 s.

    Nearly twice the timeout in all, and the transfer never stops moving for long.
    """
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
            str(SCRIPTS / "stalled_peer.py"), "none", "0", "1", "16",
            settings={"RINGTRAIN_COLLECTIVE_TIMEOUT": str(TIMEOUT)},
        )  # fmt: skip
    finally:
        for name in names:
            _tc(name, "del", "dev", "eth0", "root")
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert len(re.findall(r"all 1 steps right", done.stdout)) == sum(SLOTS)


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


@pytest.mark.parametrize(
    ("script", "slots", "settings"),
    [
        ("check_allreduce.py", SLOTS, {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "0"}),
        # Two ranks exchange their buffers instead of running the ring, in 32 KiB pieces up
        # to 2 MiB, with the sends in flight that the link rate they time calls for.
        ("check_allreduce.py", [1, 1], {}),
        # Hosts of one size: every rank carries its segment across hosts. (Hosts of different
        # sizes go through their first ranks: the training test above, and the 16-bit ring
        # on pretend hosts, tests/mpi/check_wire16_hosts.py.)
        ("check_allreduce.py", [2, 2], {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "1"}),
        ("check_collectives.py", SLOTS, {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "1"}),
        # the chunk across hosts of calls of 8 MiB and more, tried both ways and agreed on
        ("check_link_chunk.py", [2, 2], {}),
        # 16-bit values on the wire: bit for bit the simulated ring, within the error bound
        (
            "check_wire16.py",
            SLOTS,
            {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "0", "RINGTRAIN_RING_CHUNK_BYTES": "4096"},
        ),
    ],
    ids=[
        "allreduce-flat",
        "allreduce-pair",
        "allreduce-hierarchical-2x2",
        "collectives",
        "chunk-trial",
        "compressed",
    ],
)
def test_collectives_are_right_across_links_limited_to_200mbit(cluster, script, slots, settings):
    """Every dtype and op, lengths 0, 1 and uneven, each rank its own data, against NumPy."""
    names, _ = cluster
    layout = ",".join(map(str, slots))
    hosts = ",".join(f"{name}:{count}" for name, count in zip(names, slots, strict=False))
    where = ["-np", str(sum(slots)), "-H", hosts, "--start-timeout", "60"]
    netns.limit_links(names, "200mbit")
    try:
        done, _ = _launch(
            cluster,
            str(CHECKS / script),
            layout,
            settings={**settings, "PYTHONPATH": os.pathsep.join([str(REPO), str(CHECKS)])},
            where=where,
        )
    finally:
        netns.unlimit_links(names)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"


def _cluster_bench(*options, json_file=None):
    """Return the argv of the cluster benchmark on its own two test hosts, tiny and short."""
    command = [
        sys.executable, "-m", "ringtrain.bench", "cluster", "--prefix", BENCH_PREFIX,
        "--hosts", "2", "--ranks-per-host", "2", "--rate", "200mbit", "--iperf-seconds", "1",
        "--bench-args", "--small-count 2 --small-bytes 1024", *options,
    ]  # fmt: skip
    return command + (["--json", str(json_file)] if json_file else [])


@pytest.fixture
def bench_hosts():
    """Skip where the benchmark cannot make its hosts; remove them should a test fail."""
    reason = netns.why_unavailable(BENCH_PREFIX, ("tbf",))
    if reason:
        pytest.skip(reason)
    yield
    netns.down(BENCH_PREFIX)


def test_the_cluster_benchmark_runs_both_transports_and_removes_its_hosts(bench_hosts, tmp_path):
    out = tmp_path / "cluster.json"
    argv = _cluster_bench("--sizes", "4096,65540", "--seconds", "0.05", json_file=out)
    done, _ = bounded.run(argv, 180, env=_repo_env())
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert netns.left_behind(BENCH_PREFIX) == []
    result = json.loads(out.read_text())
    assert (result["hosts"], result["rate_bits_per_s"], result["delay"]) == (2, 200e6, None)
    ceiling = result["tcp_ceiling_bits_per_s"]
    if shutil.which("iperf3"):  # the cap holds: TCP never goes faster than it
        assert 0 < ceiling <= 1.05 * 200e6, ceiling
    else:
        assert ceiling is None
    runs = [(run["ranks_per_host"], run["transport"]) for run in result["runs"]]
    assert runs == [(2, "flat"), (2, "hierarchical")]
    for run in result["runs"]:
        singles = [row["bytes"] for row in run["rows"] if row["case"] == "single"]
        assert singles == [4096, 65540]
        for row in run["rows"]:
            assert row["ranks"] == 4
            assert row["ringtrain_link_fraction"] > 0 and row["mpi_link_fraction"] > 0
            assert (row["ringtrain_tcp_fraction"] is None) == (ceiling is None)
    assert "2 hosts x 2 ranks (4 ranks), ringtrain hierarchical" in done.stdout


def test_a_sigterm_mid_run_leaves_no_namespace_or_rank_behind(bench_hosts):
    argv = _cluster_bench("--sizes", "16777216", "--seconds", "60")
    with subprocess.Popen(
        argv, env=_repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as bench:
        try:
            started = _wait_for_ranks(netns.host_names(2, BENCH_PREFIX), 4)
            bench.send_signal(signal.SIGTERM)
            out, err = bench.communicate(timeout=60)
        finally:
            bench.kill()
    assert bench.returncode == 128 + signal.SIGTERM, f"stdout:\n{out}\nstderr:\n{err}"
    assert "ended by SIGTERM; the test hosts are removed" in err
    assert netns.left_behind(BENCH_PREFIX) == []
    assert [pid for pid, command in started.items() if _command(pid) == command] == []


def test_the_tcp_ceiling_waits_for_its_server_and_names_why_it_failed(cluster):
    """iperf3 3.12 exits 0 with an ``error`` and no traffic when nothing listens yet."""
    if shutil.which("iperf3") is None:
        pytest.skip("no iperf3 here (apt-get install -y iperf3)")
    names, _ = cluster
    address = _address(names[1])
    assert ceiling._client(names[0], address, 0.2) == (
        None,
        "unable to connect to server: Connection refused",
    )
    bits, note = ceiling.tcp_ceiling(names[1], address, names[0], 1)
    assert bits > 0 and note is None


def _address(name):
    """Return the IPv4 address of test host ``name``'s eth0."""
    shown = subprocess.run(
        ["ip", "-n", name, "-4", "-o", "addr", "show", "eth0"],
        capture_output=True, text=True, timeout=20, check=True,
    ).stdout  # fmt: skip
    return shown.split(" inet ")[1].split("/")[0]


def _wait_for_ranks(names, count, within=120):
    """Wait for ``count`` ranks on the hosts ``names``; return every process there then.

    Processes are keyed by pid, with their command line to tell a reused pid apart.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        running = {pid: _command(pid) for _, pid in _left_running(names, "")}
        ranks = [c for c in running.values() if (c or "").split("\0")[1:3] == ["-m", GUARD]]
        if len(ranks) >= count:
            return running
        time.sleep(0.5)
    raise AssertionError(f"{count} ranks did not start on {names} within {within} s")


def _command(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except FileNotFoundError:
        return None
