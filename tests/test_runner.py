"""The launcher's pure parts: hostfiles, argv lists per MPI flavour, settings, guard, dry run."""

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ringtrain import contract, settings
from ringtrain.runner import cli, exports, hydra, openmpi
from ringtrain.runner.flavour import Flavour, parse_version
from ringtrain.runner.hosts import (
    Host,
    HostfileError,
    check_slots,
    host_of_rank,
    parse_discovered,
    parse_host_list,
    parse_hostfile,
)
from ringtrain.runner.job import Job, LaunchError
from ringtrain.runner.locate import find_mpirun
from ringtrain.runner.rank_command import guarded

REPO = Path(__file__).resolve().parent.parent
GUARD = ["-m", "ringtrain.guard"]


def _hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(textwrap.dedent(text))
    return str(path)


# hostfiles and host lists


def test_hostfile_formats_comments_and_blank_lines(tmp_path):
    path = _hostfile(
        tmp_path,
        """\
        # two machines
        node-a slots=4   # the big one

        node-b:2
        10.0.0.7
        node-c   slots = 1
        """,
    )
    assert parse_hostfile(path) == [
        Host("node-a", 4),
        Host("node-b", 2),
        Host("10.0.0.7", 1),
        Host("node-c", 1),
    ]


def test_repository_hostfile_examples_parse():
    examples = sorted((REPO / "hostfiles").iterdir())
    names = ["discover-hosts.sh", "elastic-hosts", "one-machine", "two-machines"]
    assert [p.name for p in examples] == names
    assert parse_hostfile(str(REPO / "hostfiles/one-machine")) == [Host("localhost", 4)]
    assert [h.slots for h in parse_hostfile(str(REPO / "hostfiles/two-machines"))] == [4, 4]
    env = {k: v for k, v in os.environ.items() if k != "DISCOVER_HOSTS_FILE"}
    script = str(REPO / "hostfiles/discover-hosts.sh")
    listed = subprocess.run([script], env=env, capture_output=True, text=True, check=True)
    assert parse_discovered(listed.stdout, script, 1) == [Host("localhost", 2)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a slots=2\nb slots=two\n", r"hosts:2: cannot parse 'b slots=two'"),
        ("a slots=2\n\nb max_slots=3\n", r"hosts:3: cannot parse 'b max_slots=3'"),
        ("a slots=0\n", r"hosts:1: slots must be at least 1, not 0"),
        ("a:-2\n", r"hosts:1: slots must be at least 1, not -2"),
        ("a slots=1\nb slots=1\na:2\n", r"hosts:3: host 'a' is listed twice \(first at \S+:1\)"),
        ("# nothing\n\n", r"hosts: no hosts listed"),
    ],
)
def test_hostfile_errors_name_file_and_line(tmp_path, text, message):
    path = _hostfile(tmp_path, text)
    with pytest.raises(HostfileError, match=message) as caught:
        parse_hostfile(path)
    assert str(caught.value).startswith(path)


def test_host_list():
    assert parse_host_list("a:2, b ,c:1") == [Host("a", 2), Host("b", 1), Host("c", 1)]
    with pytest.raises(HostfileError, match=r"-H entry 2: empty host name"):
        parse_host_list("a:2,,b")
    with pytest.raises(HostfileError, match=r"-H entry 2: host 'a' is listed twice"):
        parse_host_list("a:2,a:1")
    with pytest.raises(HostfileError, match=r"-H entry 1: cannot parse 'a slots=2'"):
        parse_host_list("a slots=2")


def test_ranks_fill_the_slots_in_order():
    hosts = [Host("a", 2), Host("b", 1)]
    assert [host_of_rank(hosts, rank) for rank in range(4)] == ["a", "a", "b", None]


def test_np_must_fit_the_slots_unless_oversubscribing():
    hosts = [Host("a", 2), Host("b", 2)]
    check_slots(hosts, 4, "my-hosts", oversubscribe=False)
    check_slots(hosts, 9, "my-hosts", oversubscribe=True)
    with pytest.raises(HostfileError, match=r"^my-hosts: -np 5 is more than the 4 slots"):
        check_slots(hosts, 5, "my-hosts", oversubscribe=False)


# argv lists

ENV = (("RINGTRAIN_CYCLE_TIME", "2.5"), ("RINGTRAIN_TIMELINE", "/tmp/my run's.json"))
COMMAND = ("python", "train.py", "--name", 'a "quoted" arg with spaces')


def test_openmpi_argv_on_this_machine():
    job = Job(command=("python", "train.py"), num_proc=3)
    assert openmpi.build_argv("/opt/bin/mpirun", job) == [
        "/opt/bin/mpirun", "-np", "3", "--allow-run-as-root", "--bind-to", "none",
        "--map-by", "slot:OVERSUBSCRIBE", "--output", "tag", "--mca", "opal_abort_delay", "2",
        "python", "train.py",
    ]  # fmt: skip


def test_openmpi_argv_with_everything():
    job = Job(
        command=COMMAND,
        num_proc=4,
        hosts=(Host("node a", 2), Host("b", 2)),
        env=ENV,
        network_interface="10.0.0.0/24",
        mpi_args=("--mca", "btl", "^openib"),
    )
    assert openmpi.build_argv("mpirun", job) == [
        "mpirun", "-np", "4", "--allow-run-as-root", "--bind-to", "none",
        "--map-by", "slot", "--output", "tag", "--mca", "opal_abort_delay", "2",
        "--host", "node a:2,b:2",
        "--mca", "btl_tcp_if_include", "10.0.0.0/24",
        "--prtemca", "oob_tcp_if_include", "10.0.0.0/24",
        "-x", "RINGTRAIN_CYCLE_TIME=2.5", "-x", "RINGTRAIN_TIMELINE=/tmp/my run's.json",
        "--mca", "btl", "^openib",
        *COMMAND,
    ]  # fmt: skip


def test_openmpi_oversubscribe_with_hosts_when_asked():
    job = Job(command=("x",), num_proc=8, hosts=(Host("a", 2),), oversubscribe=True)
    argv = openmpi.build_argv("mpirun", job)
    assert argv[argv.index("--map-by") + 1] == "slot:OVERSUBSCRIBE"


def test_hydra_argv_with_everything():
    job = Job(
        command=COMMAND,
        num_proc=4,
        hosts=(Host("a", 2), Host("b", 2)),
        env=ENV,
        network_interface="ib0",
        mpi_args=("-verbose",),
    )
    assert hydra.build_argv("/usr/bin/mpiexec", job) == [
        "/usr/bin/mpiexec", "-n", "4", "-bind-to", "none", "-prepend-rank",
        "-hosts", "a:2,b:2",
        "-iface", "ib0",
        "-genv", "RINGTRAIN_CYCLE_TIME", "2.5", "-genv", "RINGTRAIN_TIMELINE", "/tmp/my run's.json",
        "-verbose",
        *COMMAND,
    ]  # fmt: skip
    local = hydra.build_argv("mpiexec", Job(command=("x",), num_proc=2))
    assert local == ["mpiexec", "-n", "2", "-bind-to", "none", "-prepend-rank", "x"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"network_interface": "10.0.0.0/24"}, "single interface name"),
        ({"network_interface": "eth0,eth1"}, "single interface name"),
    ],
)
def test_hydra_refuses_what_it_cannot_do(changes, message):
    with pytest.raises(LaunchError, match=message):
        hydra.build_argv("mpiexec", Job(command=("x",), num_proc=2, **changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"command": ()}, "no command"),
        ({"num_proc": 0}, "-np must be at least 1"),
        ({"network_interface": "10.0.0.0/33"}, "--network-interface"),
        ({"network_interface": "eth0,"}, "empty entry"),
    ],
)
def test_job_validates_itself(changes, message):
    with pytest.raises(LaunchError, match=message):
        Job(**{"command": ("x",), "num_proc": 1, **changes})


# mpirun flavour


@pytest.mark.parametrize(
    ("text", "flavour"),
    [
        ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/", Flavour.OPENMPI),
        ("HYDRA build details:\n    Version:  4.1.2\n", Flavour.HYDRA),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10", Flavour.HYDRA),
    ],
)
def test_flavour_from_version_text(text, flavour):
    assert parse_version(text) is flavour


def test_flavour_errors():
    with pytest.raises(
        LaunchError, match=r"needs Open MPI 5 or later; this mpirun is \(Open MPI\) 4"
    ):
        parse_version("mpirun (Open MPI) 4.1.5\n")
    with pytest.raises(LaunchError, match=r"cannot tell which MPI .* 'srun 23.02'"):
        parse_version("\nsrun 23.02\n")


# settings exported to the ranks


def test_options_become_ringtrain_variables():
    env = exports.settings_env(
        {"PATH": "/bin", "RINGTRAIN_CYCLE_TIME": "9", "RINGTRAIN_CACHE_CAPACITY": "10"},
        fusion_threshold_mb=1.5,
        cycle_time_ms=2.5,
        timeline_filename="/tmp/t.json",
        stall_check_warning_time_seconds=30,
        stall_check_shutdown_time_seconds=120.0,
        hierarchical_allreduce=True,
    )
    assert env == {
        settings.env_name("fusion_threshold"): str(3 * 512 * 1024),
        settings.env_name("cycle_time_ms"): "2.5",
        settings.env_name("timeline"): "/tmp/t.json",
        settings.env_name("stall_check_seconds"): "30",
        settings.env_name("stall_shutdown_seconds"): "120.0",
        settings.env_name("hierarchical_allreduce"): "1",
        settings.env_name("cache_capacity"): "10",
    }
    unset = exports.settings_env({"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "1"}, cycle_time_ms=None)
    assert unset == {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "1"}
    assert exports.settings_env({}, hierarchical_allreduce=False) == {}


def test_bad_option_value_names_the_variable():
    with pytest.raises(ValueError, match="RINGTRAIN_CYCLE_TIME: expected a number > 0"):
        exports.settings_env({}, cycle_time_ms=0.0)


# the rank guard


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "t.py", "-m", "x"], ["python", *GUARD, "t.py", "-m", "x"]),
        (["/usr/bin/python3.11", "-u", "-W", "ignore", "t.py"],
         ["/usr/bin/python3.11", "-u", "-W", "ignore", *GUARD, "t.py"]),
        (["python3", "-OB", "-Xdev", "-m", "pkg.train"],
         ["python3", "-OB", "-Xdev", *GUARD, "-m", "pkg.train"]),
        (["python", "-c", "print(1)", "a"], ["python", *GUARD, "-c", "print(1)", "a"]),
        (["python"], ["python"]),
        (["python", "--version"], ["python", "--version"]),
        (["python", "-"], ["python", "-"]),
        (["./train.sh", "t.py"], ["./train.sh", "t.py"]),
        (["pythonista", "t.py"], ["pythonista", "t.py"]),
    ],
)  # fmt: skip
def test_guard_goes_in_front_of_python_scripts_only(command, expected):
    assert guarded(command) == expected


def test_guard_announces_the_start_when_asked():
    assert guarded(["python", "-u", "t.py"], announce=True) == [
        "python", "-u", *GUARD, "--announce", "t.py",
    ]  # fmt: skip
    assert guarded(["./train.sh"], announce=True) == ["./train.sh"]


def test_guard_runs_a_script_as_python_would(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 'sibling'\n")
    (tmp_path / "main.py").write_text(
        "import sys, helper\nprint(__name__, sys.argv[1:], helper.VALUE)\n"
    )
    argv = [sys.executable, *GUARD, "--announce", str(tmp_path / "main.py"), "a b", "-c"]
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "5"}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "@@ringtrain-run: rank 5 started@@\n__main__ ['a b', '-c'] sibling\n"
    assert contract.STARTED.fullmatch(done.stdout.splitlines()[0].encode())[1] == b"5"


# the command line, without launching


def test_dry_run_prints_the_exact_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RINGTRAIN_STALL_CHECK_SECONDS", "5")
    hostfile = _hostfile(tmp_path, "node1 slots=2\nnode2:2\n")
    status = cli.main(
        ["-np", "4", "--hostfile", hostfile, "--fusion-threshold-mb", "32", "--dry-run",
         "--hierarchical-allreduce", "--mpi-args", "--mca btl tcp,self",
         "python", "train.py", "--tag", "two words"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0
    assert shlex.split(printed) == [
        find_mpirun(), "-np", "4", "--allow-run-as-root", "--bind-to", "none",
        "--map-by", "slot", "--output", "tag", "--mca", "opal_abort_delay", "2",
        "--host", "node1:2,node2:2",
        "-x", "RINGTRAIN_FUSION_THRESHOLD=33554432",
        "-x", "RINGTRAIN_HIERARCHICAL_ALLREDUCE=1", "-x", "RINGTRAIN_STALL_CHECK_SECONDS=5",
        "--mca", "btl", "tcp,self",
        "python", *GUARD, "train.py", "--tag", "two words",
    ]  # fmt: skip
    assert printed == shlex.join(shlex.split(printed)) + "\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-np", "3", "-H", "a:1,b:1", "python", "t.py"], "-H: -np 3 is more than the 2 slots"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "x"], "No such file"),
        (["-np", "2", "--cycle-time-ms", "-1", "x"], "RINGTRAIN_CYCLE_TIME"),
        (["-np", "2", "--network-interface", "10.1.2.0/40", "x"], "--network-interface"),
    ],
)
def test_cli_errors_exit_2_with_a_message(argv, message, capsys):
    assert cli.main(["--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ringtrain-run: error: ") and message in err


def test_cli_needs_a_command(capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["-np", "2", "--dry-run"])
    assert caught.value.code == 2
    assert "no command to run" in capsys.readouterr().err
