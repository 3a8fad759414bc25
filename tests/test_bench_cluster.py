"""The benchmarks across hosts: options and refusals (the cluster run is in test_multihost)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.bench import cluster, netns
from ringtrain.bench.__main__ import main as bench_main

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (netns.parse_rate, "1gbit", 10**9),
        (netns.parse_rate, "10gbit", 10**10),
        (netns.parse_rate, "200mbit", 2 * 10**8),
        (netns.parse_rate, "1.5Mbit", 1_500_000),
        (netns.parse_burst, "256kb", 256 << 10),
        (netns.parse_burst, "2MB", 2 << 20),
        (netns.parse_burst, "9b", 9),
    ],
)
def test_a_link_rate_or_burst_is_read_as_tc_writes_it(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "refusal"),
    [
        *((netns.parse_rate, t, "link rate {!r}: expected a positive number")
          for t in ["1gbps", "fast", "0mbit", "-1gbit", ""]),
        *((netns.parse_burst, t, "burst {!r}: expected a positive whole number")
          for t in ["256", "0kb", "1.5mb", "256kbit", ""]),
    ],
)  # fmt: skip
def test_a_bad_link_rate_or_burst_is_refused_by_name(parse, text, refusal):
    with pytest.raises(ValueError, match=re.escape(refusal.format(text))):
        parse(text)


def test_a_delay_takes_a_unit_of_time():
    assert netns.check_delay("500us") == "500us"
    with pytest.raises(ValueError, match="link delay '2': expected a number and us, ms or s"):
        netns.check_delay("2")


def _cluster(*options, prefix=()):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    command = [*prefix, sys.executable, "-m", "ringtrain.bench", "cluster", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_bad_options_are_refused_naming_them():
    done = _cluster("--hosts", "1", "--ranks-per-host", "2,0")
    assert done.returncode == 2
    assert "argument --hosts: 1 hosts: expected at least 2" in done.stderr
    done = _cluster("--burst", "lots")
    assert done.returncode == 2
    assert "argument --burst: burst 'lots': expected a positive whole number" in done.stderr


def test_it_refuses_without_root_and_says_so():
    """Run as an unprivileged user of a user namespace (``unshare --user``): no traceback."""
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` command (util-linux) to run as another user")
    probe = subprocess.run(["unshare", "--user", "true"], capture_output=True, timeout=20)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a user namespace here: {probe.stderr.decode().strip()}")
    done = _cluster(prefix=["unshare", "--user"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "python -m ringtrain.bench cluster: cannot run: making network namespaces needs root"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--hosts", "1"], "1 hosts: expected at least 2"),
        (["--hosts", "2", "--rates", "1gbit,1gbyte"], "link rate '1gbyte': expected a positive"),
        (["--hosts", "2", "--delay", "2"], "link delay '2': expected a number and us, ms or s"),
    ],
)
def test_training_across_hosts_refuses_bad_options_by_name(options, message, capsys):
    assert bench_main(["train", *options]) == 2
    assert message in capsys.readouterr().err


def test_the_link_bound_counts_what_an_allreduce_must_send_out_of_each_host():
    from ringtrain.bench.train_cluster import link_bound

    # Two hosts: each sends its whole 125 MB at 1 Gbit/s, one second a step of 2 x 64.
    assert link_bound(125_000_000, 2, 64, 1_000_000_000) == pytest.approx(128)
    # Four hosts: each sends 3/2 of it; ten times the rate is ten times the steps.
    assert link_bound(125_000_000, 4, 64, 10_000_000_000) == pytest.approx(256 * 10 / 1.5)


def test_a_launch_gets_a_collective_timeout_inside_its_own_unless_one_is_set():
    env = cluster.launch_env("hierarchical", 300, {"PATH": "/bin"})
    assert env["RINGTRAIN_COLLECTIVE_TIMEOUT"] == "150"
    assert env["RINGTRAIN_HIERARCHICAL_ALLREDUCE"] == "1" and env["PATH"] == "/bin"
    env = cluster.launch_env("flat", 300, {"RINGTRAIN_COLLECTIVE_TIMEOUT": "20"})
    assert env["RINGTRAIN_COLLECTIVE_TIMEOUT"] == "20"
    assert env["RINGTRAIN_HIERARCHICAL_ALLREDUCE"] == "0"


def test_a_launch_past_its_time_ends_with_what_it_printed(tmp_path):
    argv = [sys.executable, "-c", "import time; print('at step 3', flush=True); time.sleep(60)"]
    with pytest.raises(RuntimeError) as failed:
        cluster._run_bounded(argv, dict(os.environ), 2, "2 hosts x 2 ranks, flat", tmp_path)
    assert str(failed.value) == (
        "the benchmark on 2 hosts x 2 ranks, flat ran past 2 s; its output ends:\nat step 3\n"
    )
