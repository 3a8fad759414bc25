"""Elastic jobs: ``ringtrain-run --host-discovery-script`` relaunches, and states resume.

The launches are real: ``ringtrain-run`` runs mpirun on this machine, ranks die with
``os._exit``, and the discovery script prints a file that a rank rewrites. The job
(tests/elastic/numpy_job.py) records every step it took and the world size it took it at;
each test replays that history in NumPy and checks that every step ran exactly once and
that the weights are what those steps give.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_launch import launch

from ringtrain import contract, settings
from ringtrain.elastic import ObjectState, commits, notices
from ringtrain.runner import elastic, hosts, watchdog
from ringtrain.runner.blacklist import Blacklist, culprits
from ringtrain.runner.hosts import Host, HostfileError
from ringtrain.runner.job import LaunchError

REPO = Path(__file__).resolve().parent.parent
JOB = str(REPO / "tests/elastic/numpy_job.py")
KERAS_JOB = str(REPO / "tests/elastic/keras_job.py")
sys.path.insert(0, str(REPO / "tests/elastic"))
import discovery  # noqa: E402 - next to the job it serves
import replay  # noqa: E402 - next to the job it checks


def _run(tmp_path, args, steps, every, timeout=150, **job_env):
    job_env.update(
        ELASTIC_STEPS=str(steps),
        ELASTIC_COMMIT_EVERY=str(every),
        ELASTIC_OUT=str(tmp_path / "out.json"),
    )
    return _launch_job(tmp_path, args, JOB, timeout, job_env)


def _launch_job(tmp_path, args, job, timeout, job_env):
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3", **job_env)
    argv = [sys.executable, "-m", "ringtrain.runner", *args, sys.executable, job]
    return launch(argv, timeout, cwd=tmp_path, env=env)[0]


def _result(tmp_path, steps):
    return replay.checked_result(tmp_path / "out.json", steps)


@pytest.mark.mpi
def test_a_crashed_rank_relaunches_the_job_from_its_last_commit(tmp_path):
    script = discovery.script(tmp_path, "localhost:3")
    done = _run(
        tmp_path,
        ["-np", "3", "--host-discovery-script", script],
        steps=30,
        every=5,
        ELASTIC_CRASH="0:13:2",
    )
    assert done.returncode == 0, done.stderr
    assert "the job failed (exit status 3); relaunching from its last commit" in done.stderr
    result = _result(tmp_path, 30)
    assert {size for _, size, _ in result["history"]} == {3}
    # Steps 0-9 ran before the last commit (at step 10), and were not run again.
    assert [launch for _, _, launch in result["history"]] == ["0"] * 10 + ["1"] * 20
    assert result["generation"] == 1
    assert result["resets"] == [3]  # the reset callbacks ran in the relaunch


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("first", "then", "bounds"),
    [("localhost:1", "localhost:2", ("1", "2")), ("localhost:4", "localhost:2", ("2", "4"))],
    ids=["grow-1-to-2", "shrink-4-to-2"],
)
def test_new_hosts_stop_the_ranks_at_a_commit_and_relaunch_them(tmp_path, first, then, bounds):
    before, after = (int(listing.split(":")[1]) for listing in (first, then))
    script = discovery.script(tmp_path, first)
    done = _run(
        tmp_path,
        ["-np", str(before), "--min-np", bounds[0], "--max-np", bounds[1]]
        + ["--host-discovery-script", script],
        steps=120,
        every=5,
        ELASTIC_HOSTS=f"0:8:{tmp_path / 'hosts'}:{then}",
        ELASTIC_SLOW="0.05",
    )
    assert done.returncode == 0, done.stderr
    assert f"the hosts have changed ({then})" in done.stderr
    assert "the ranks stopped at a commit for the new hosts; relaunching" in done.stderr
    assert f"generation 1: {after} ranks on {then}" in done.stderr
    assert "ending the job" not in done.stderr  # the ranks stopped together, none failed
    result = _result(tmp_path, 120)
    sizes = [size for _, size, _ in result["history"]]
    switch = sizes.index(after)
    assert switch > 8 and switch % 5 == 0  # at a commit after the change
    assert sizes == [before] * switch + [after] * (120 - switch)
    assert result["resets"] == [after]


@pytest.mark.mpi
def test_keras_training_resumed_after_crashes_ends_as_if_uninterrupted(tmp_path):
    """``fit`` with KerasState and the callbacks, then a custom loop with TensorFlowKerasState.

    Rank 1 dies inside the third epoch of ``fit`` in the first launch, and inside the third
    epoch of the custom loop in the second.
    """
    args = ["-np", "2", "--host-discovery-script", discovery.script(tmp_path, "localhost:2")]
    results, said = {}, {}
    for run, crash in (("crashed", "fit:0:2:3,tape:1:2:4"), ("whole", "")):
        out = tmp_path / f"{run}.npz"
        job_env = {"KERAS_OUT": str(out), "KERAS_CRASH": crash}
        done = _launch_job(tmp_path, args, KERAS_JOB, 300, job_env)
        assert done.returncode == 0, done.stderr
        results[run], said[run] = np.load(out), done.stderr
    crashed, whole = results["crashed"], results["whole"]
    assert said["crashed"].count("the job failed (exit status 3); relaunching") == 2
    assert (int(crashed["generation"]), int(whole["generation"])) == (2, 0)
    assert crashed["epochs"].tolist() == whole["epochs"].tolist() == [4, 4]
    assert int(crashed["tape_steps"]) == int(whole["tape_steps"]) == 24  # a TensorFlowState
    for part in ("fit", "tape"):  # the optimizers resumed too
        assert int(crashed[f"{part}_iterations"]) == int(whole[f"{part}_iterations"]) == 24
        for i in range(4):  # the model's two kernels and biases
            np.testing.assert_allclose(
                crashed[f"{part}{i}"], whole[f"{part}{i}"], rtol=1e-6, atol=1e-7
            )


@pytest.mark.mpi
def test_the_launcher_gives_up_after_the_reset_limit_and_keeps_the_commit(tmp_path):
    script = discovery.script(tmp_path, "localhost:2")
    state_dir = tmp_path / "commits"
    done = _run(
        tmp_path,
        ["-np", "2", "--reset-limit", "1", "--elastic-state-dir", str(state_dir)]
        + ["--host-discovery-script", script],
        steps=30,
        every=4,
        ELASTIC_CRASH="*:10:1",
        ELASTIC_TAG="a",
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("relaunching from its last commit") == 1
    assert "the job failed 2 times, more than --reset-limit 1; giving up (exit status 3)" in (
        done.stderr
    )
    assert f"its commits are in {state_dir}: pass --elastic-state-dir {state_dir}" in done.stderr
    assert not (tmp_path / "out.json").exists()
    # A new launch on the same directory resumes from that commit (steps 0-7).
    done = _run(
        tmp_path,
        ["-np", "2", "--elastic-state-dir", str(state_dir), "--host-discovery-script", script],
        steps=30,
        every=4,
        ELASTIC_TAG="b",
    )
    assert done.returncode == 0, done.stderr
    result = _result(tmp_path, 30)
    assert [launch for _, _, launch in result["history"]] == ["a0"] * 8 + ["b0"] * 22
    assert result["generation"] == 0 and result["resets"] == []
    assert state_dir.is_dir()  # a directory the user named stays


@pytest.mark.mpi
@pytest.mark.skipif(
    socket.gethostname() in ("localhost", ""), reason="needs a second name for this machine"
)
def test_the_host_of_an_unreachable_rank_is_left_out_until_its_cooldown_ends(tmp_path):
    """Two names of this machine stand for two hosts: ``localhost`` and its own name.

    In the first launch rank 0 says that rank 2 (on the second host) stopped answering, and
    fails. The job goes on from its last commit on the first host alone, and takes the
    second host back at a commit once its cool-down is over.
    """
    other = socket.gethostname()
    script = discovery.script(tmp_path, f"localhost:2,{other}:1")
    done = _run(
        tmp_path,
        ["-np", "3", "--min-np", "2", "--blacklist-cooldown", "3"]
        + ["--host-discovery-script", script],
        steps=150,
        every=5,
        ELASTIC_LOSE="0:7:0:2",
        ELASTIC_SLOW="0.05",
    )
    assert done.returncode == 0, done.stderr
    assert "stopped answering" not in done.stdout + done.stderr  # the launcher's line only
    assert f"host {other} failed (time 1 of --blacklist-limit 2); it is left out for 3 s" in (
        done.stderr
    )
    assert "host localhost failed" not in done.stderr  # rank 0 failed, but for its lost peer
    assert "generation 1: 2 ranks on localhost:2" in done.stderr
    assert f"the hosts have changed (localhost:2, {other}:1)" in done.stderr
    assert f"generation 2: 3 ranks on localhost:2, {other}:1" in done.stderr
    result = _result(tmp_path, 150)
    sizes = [size for _, size, _ in result["history"]]
    back = sizes.index(3, 5)
    assert sizes[:5] == [3] * 5 and set(sizes[5:back]) == {2} and set(sizes[back:]) == {3}


@pytest.mark.mpi
def test_a_stopped_launcher_does_not_relaunch(tmp_path):
    script = discovery.script(tmp_path, "localhost:2")
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, ELASTIC_STEPS="100000", ELASTIC_COMMIT_EVERY="5")
    env.update(ELASTIC_OUT=str(tmp_path / "out.json"), ELASTIC_SLOW="0.01")
    argv = [sys.executable, "-m", "ringtrain.runner", "-np", "2", "--host-discovery-script"]
    argv += [script, "--elastic-state-dir", str(tmp_path / "commits")]
    with subprocess.Popen(
        [*argv, sys.executable, JOB],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        time.sleep(5)  # the job is training by then
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode != 0
    assert f"stopped (exit status {proc.returncode}); its commits are in {tmp_path}" in err
    assert "relaunching" not in err and "generation 1" not in err


@pytest.mark.mpi
def test_too_few_slots_time_out_with_a_clear_error(tmp_path):
    script = discovery.script(tmp_path, "localhost:1")
    done = _run(
        tmp_path,
        ["-np", "2", "--elastic-timeout", "1.5", "--host-discovery-script", script],
        steps=1,
        every=1,
        timeout=60,
    )
    assert done.returncode == 2
    assert "waiting for 2 slots (--min-np); the hosts have 1" in done.stderr
    assert re.search(
        r"listed 1 slots, fewer than --min-np 2, for --elastic-timeout 1.5 s", (done.stderr)
    )


@pytest.mark.mpi
def test_a_failing_discovery_script_is_an_error_that_names_it(tmp_path):
    script = tmp_path / "broken.sh"
    script.write_text("#!/bin/sh\necho 'no scheduler here' >&2\nexit 4\n")
    script.chmod(0o755)
    done = _run(tmp_path, ["-np", "2", "--host-discovery-script", str(script)], 1, 1, timeout=60)
    assert done.returncode == 2
    assert f"the host discovery script {str(script)!r} exited with status 4: no scheduler here" in (
        done.stderr
    )


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-np", "1"], "--min-np needs --host-discovery-script"),
        (["--reset-limit", "2"], "--reset-limit needs --host-discovery-script"),
        (["--blacklist-cooldown", "5"], "--blacklist-cooldown needs --host-discovery-script"),
        (["--blacklist-limit", "1"], "--blacklist-limit needs --host-discovery-script"),
        (["--host-discovery-script", "x", "-H", "a:2"], "drop -H/--hostfile"),
        (["--host-discovery-script", "x", "--start-timeout", "5"], "--start-timeout cannot"),
    ],
)
def test_elastic_options_that_do_not_fit_are_refused(tmp_path, args, message):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "ringtrain.runner", "-np", "2", *args, sys.executable, JOB]
    done = launch(argv, 60, cwd=tmp_path, env=env)[0]
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.mpi
def test_dry_run_prints_the_first_launch(tmp_path):
    script = discovery.script(tmp_path, "localhost:2\nother:4")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "ringtrain.runner", "-np", "2", "--max-np", "5"]
    argv += ["--host-discovery-script", script, "--elastic-state-dir", "/data/c", "--dry-run"]
    done = launch([*argv, "python", "train.py"], 60, cwd=tmp_path, env=env)[0]
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert " -np 5 " in line and "--host localhost:2,other:3" in line
    assert "-x RINGTRAIN_ELASTIC_DIR=/data/c -x RINGTRAIN_ELASTIC_GENERATION=0" in line
    assert line.endswith("python -m ringtrain.guard --announce train.py")


# -- the pure parts --------------------------------------------------------------------------


def _options(**changes):
    return elastic.Elastic(**{"script": "s", "min_np": 2, "max_np": 5, **changes})


def test_placement_takes_slots_in_order_up_to_max_np():
    found = [Host("a", 2), Host("b", 4), Host("c", 1)]
    assert elastic.placement(_options(), found) == ((Host("a", 2), Host("b", 3)), 5)
    assert elastic.placement(_options(max_np=2), found) == ((Host("a", 2),), 2)
    assert elastic.placement(_options(), [Host("a", 1)]) is None
    assert elastic.placement(_options(min_np=1, max_np=1), [Host("a", 1)]) == ((Host("a", 1),), 1)
    assert elastic.placement(_options(), []) is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_np": 0}, "--min-np must be at least 1, not 0"),
        ({"max_np": 1}, "--max-np 1 is less than --min-np 2"),
        ({"slots_per_host": 0}, "--slots-per-host must be at least 1, not 0"),
        ({"timeout": 0.0}, "--elastic-timeout must be positive, not 0"),
        ({"reset_limit": -1}, "--reset-limit must be at least 0, not -1"),
        ({"blacklist_cooldown": -1.0}, "--blacklist-cooldown must be at least 0, not -1"),
        ({"blacklist_limit": 0}, "--blacklist-limit must be at least 1, not 0"),
    ],
)
def test_bad_elastic_options_are_named(changes, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        _options(**changes)


def test_discovered_hosts_parse_with_default_slots():
    text = "a:2\n\n# a comment\nb\nc slots=3\n"
    assert hosts.parse_discovered(text, "s", 4) == [Host("a", 2), Host("b", 4), Host("c", 3)]
    assert hosts.parse_discovered("  \n", "s", 1) == []
    with pytest.raises(HostfileError, match=r"s:2: cannot parse 'b:x'"):
        hosts.parse_discovered("a:1\nb:x\n", "s", 1)
    with pytest.raises(HostfileError, match=r"host 'a' is listed twice"):
        hosts.parse_discovered("a:1\na:2\n", "s", 1)


def test_the_elastic_launch_is_read_strictly():
    assert settings.elastic_launch({}) == settings.ElasticLaunch(None, 0)
    launch_env = {contract.ELASTIC_DIR: "/d", contract.ELASTIC_GENERATION: "3"}
    assert settings.elastic_launch(launch_env) == settings.ElasticLaunch("/d", 3)
    with pytest.raises(ValueError, match="RINGTRAIN_ELASTIC_GENERATION"):
        settings.elastic_launch({contract.ELASTIC_GENERATION: "-1"})


def test_commits_replace_the_file_whole(tmp_path):
    assert commits.number(str(tmp_path / "elsewhere"), "state0") == -1
    commits.write(str(tmp_path / "elsewhere"), "state0", 1, [])  # made where it is missing
    assert commits.number(str(tmp_path / "elsewhere"), "state0") == 1
    assert commits.number(str(tmp_path), "state0") == -1
    commits.write(str(tmp_path), "state0", 1, {"w": [1, 2]})
    commits.write(str(tmp_path), "state0", 2, {"w": [3]})
    assert commits.number(str(tmp_path), "state0") == 2
    assert commits.read(str(tmp_path), "state0") == {"w": [3]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "state0.commit"]


def test_object_state_commits_copies():
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, history=[1], epoch=0)
    state.history.append(2)
    state.epoch = 1
    state.save()
    state.history.append(3)  # after the save: not committed
    state.epoch = 2
    state.restore()
    assert (state.history, state.epoch) == ([1, 2], 1)
    state.history.append(4)
    state.restore()
    assert state.history == [1, 2]  # restoring twice gives the committed value again


def test_the_notice_counter_counts_the_launchers_signal():
    counter = notices.counter()
    assert notices.counter() is counter  # one per process, as the signal's handler is
    before = counter.received
    previous = signal.getsignal(contract.NOTICE_SIGNAL)
    counter.install()
    try:
        signal.raise_signal(contract.NOTICE_SIGNAL)  # its handler runs before this returns
        assert counter.received == before + 1
        signal.raise_signal(contract.NOTICE_SIGNAL)
        assert counter.received == before + 2
    finally:
        signal.signal(contract.NOTICE_SIGNAL, previous)


def test_a_relaunch_asks_a_failing_discovery_script_again(tmp_path, capsys):
    calls = tmp_path / "calls"
    script = tmp_path / "flaky.sh"
    # Fails on its first call, prints a line that does not parse on its second.
    script.write_text(
        f"#!/bin/sh\necho x >> {calls}\n"
        f'case $(wc -l < {calls}) in 1) exit 5;; 2) echo "a:b:c";; *) echo "n1:2";; esac\n'
    )
    script.chmod(0o755)
    options = _options(script=str(script), timeout=30.0)
    with pytest.raises(LaunchError, match="exited with status 5"):
        elastic.wait_for_placement(options, options.blacklist())  # a first launch fails at once
    calls.unlink()
    found = elastic.wait_for_placement(options, options.blacklist(), patient=True)
    assert found == ((Host("n1", 2),), 2)
    said = capsys.readouterr().err
    assert "exited with status 5: (nothing on stderr); asking again" in said
    assert "cannot parse 'a:b:c'" in said


class _RecordingState:
    """Stands in for a state in the callbacks' own logic: records what they set and commit."""

    def __init__(self):
        self.epoch, self.batch, self.log = 0, 0, []

    def commit(self):
        self.log.append((self.epoch, self.batch))


def test_keras_callbacks_commit_between_epochs_after_the_state_is_updated():
    keras = pytest.importorskip("keras")
    from ringtrain.tensorflow.keras import elastic as keras_elastic

    with pytest.raises(TypeError, match="batches_per_commit must be an int, not True"):
        keras_elastic.CommitStateCallback(_RecordingState(), True)
    with pytest.raises(ValueError, match="batches_per_commit must be >= 0, not -1"):
        keras_elastic.CommitStateCallback(_RecordingState(), -1)
    state = _RecordingState()
    state.epoch = 1  # one epoch done in an earlier launch
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", loss="mse")
    callbacks = [  # the commit first, as Horovod's examples list it
        keras_elastic.CommitStateCallback(state, batches_per_commit=2),
        keras_elastic.UpdateBatchStateCallback(state),
        keras_elastic.UpdateEpochStateCallback(state),
    ]
    x = np.zeros((10, 2), "float32")
    model.fit(x, x[:, :1], batch_size=2, epochs=2, verbose=0, callbacks=callbacks)
    # Five batches an epoch. A commit every 2nd batch of this fit, counted across epochs,
    # before the callbacks after it have recorded that batch; and one between epochs (and
    # at the end), once the epoch and batch were updated.
    assert state.log == [(1, 0), (1, 2), (2, 0), (2, 0), (2, 1), (2, 3), (3, 0)]
    assert (state.epoch, state.batch) == (3, 0)


def test_a_failed_host_is_left_out_until_its_cooldown_ends():
    now = [100.0]
    blacklist = Blacklist(cooldown=30.0, limit=3, clock=lambda: now[0])
    found = [Host("a", 2), Host("b", 1), Host("c", 4)]
    assert blacklist.usable(found) == found and blacklist.describe(found) == ""
    said = blacklist.fail("b")
    assert (
        said
        == "failed (time 1 of --blacklist-limit 3); it is left out for 30 s (--blacklist-cooldown)"
    )
    assert blacklist.usable(found) == [Host("a", 2), Host("c", 4)]
    assert blacklist.describe(found) == "left out: b (cooling down)"
    now[0] = 129.9
    assert blacklist.left_out("b") and not blacklist.left_out("a")
    now[0] = 130.0
    assert not blacklist.left_out("b") and blacklist.usable(found) == found
    assert not blacklist.dropped("b")


def test_a_host_that_keeps_failing_is_dropped_for_good():
    now = [0.0]
    blacklist = Blacklist(cooldown=10.0, limit=2, clock=lambda: now[0])
    blacklist.fail("a")
    now[0] = 10.0
    assert not blacklist.left_out("a")
    assert blacklist.fail("a") == "failed 2 times (--blacklist-limit 2); it is left out for good"
    now[0] = 1e9
    assert blacklist.dropped("a") and blacklist.left_out("a")
    assert blacklist.describe([Host("a", 1), Host("b", 1)]) == "left out: a (for good)"
    once = Blacklist(cooldown=0.0, limit=1, clock=lambda: now[0])
    once.fail("b")
    assert once.left_out("b")  # a limit of 1 drops at the first failure, whatever the cool-down


def test_placement_leaves_out_blacklisted_hosts_and_waits_for_min_np(tmp_path):
    script = discovery.script(tmp_path, "a:2,b:2,c:1")
    options = _options(script=script, min_np=3, max_np=4, timeout=0.5)
    now = [0.0]
    blacklist = Blacklist(cooldown=60.0, limit=3, clock=lambda: now[0])
    blacklist.fail("a")
    assert elastic.wait_for_placement(options, blacklist) == ((Host("b", 2), Host("c", 1)), 3)
    blacklist.fail("c")  # b's 2 slots are fewer than --min-np 3
    with pytest.raises(LaunchError, match=re.escape(
        "listed 2 usable slots of 5 (left out: a (cooling down), c (cooling down)), fewer "
        "than --min-np 3, for --elastic-timeout 0.5 s"
    )):  # fmt: skip
        elastic.wait_for_placement(options, blacklist, patient=True)
    now[0] = 60.0  # the cool-downs are over
    assert elastic.wait_for_placement(options, blacklist) == ((Host("a", 2), Host("b", 2)), 4)


def test_the_hosts_to_blame_are_those_of_unreachable_ranks_else_of_failed_ones():
    placed = (Host("a", 2), Host("b", 1), Host("c", 2))  # ranks 0-1 on a, 2 on b, 3-4 on c
    assert culprits(placed, set(), set()) == []
    assert culprits(placed, {2}, {0, 1}) == ["b"]  # a's ranks failed because b went away
    assert culprits(placed, {4, 2}, set()) == ["b", "c"]
    assert culprits(placed, set(), {3}) == ["c"]
    assert culprits(placed, set(), {0, 2, 4}) == []  # every host failed: blame none
    assert culprits((Host("a", 3),), set(), {1}) == []  # one host: nothing to go on without


def test_the_relay_notes_the_contract_lines_and_hides_those_not_for_people():
    heard = watchdog.Heard()
    lines = [
        b"[1,3]<stdout>: " + contract.started_line(3).encode(),
        b"[1,0]<stderr>: " + contract.unreachable_line(2, "node2").encode(),
        b"[1,0]<stderr>: " + contract.failed_line(0, "node1", "raised TimeoutError: x").encode(),
        b"[1,1]<stderr>: rank 1 on host node1 says hello",
    ]
    assert [heard.note(line) for line in lines] == [True, True, False, False]
    assert heard == watchdog.Heard(started={3}, failed={0}, unreachable={2})
