"""Behaviour under a real mpirun at 1 to 4 ranks (oversubscribed), each run with a timeout."""

import glob
import json
import os
import re
import shutil
import sys
import time

import pytest
from mpi_launch import check, run

from ringtrain.capabilities import cuda_built
from ringtrain.mpi_tuning import EAGER_LIMIT_VARIABLE

pytestmark = pytest.mark.mpi

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("np", WORLDS)
def test_allreduce_every_dtype_and_op(np):
    check("check_allreduce.py", np, timeout=240)


@pytest.mark.parametrize("np", [2, 3])
def test_the_message_ring_with_shared_memory_off(np):
    env = {"RINGTRAIN_SHARED_MEMORY_BYTES": "0"}
    check("check_allreduce.py", np, env=env, timeout=240)
    check("check_collectives.py", np, env=env)


@pytest.mark.parametrize("np", [2, 3])
def test_the_message_ring_reuses_the_scratch_of_a_window_of_receives(np):
    # The default window posts every receive of a call of up to 64 MiB at once; 4 KiB chunks
    # and a 20000-byte window post 5 ahead, reusing their scratch slots as the calls go on.
    # Two ranks exchange their buffers instead of running the ring, through the same window.
    env = {
        "RINGTRAIN_SHARED_MEMORY_BYTES": "0",
        "RINGTRAIN_RING_CHUNK_BYTES": "4096",
        "RINGTRAIN_RING_WINDOW_BYTES": "20000",
    }
    check("check_allreduce.py", np, env=env, timeout=240)


def test_shared_memory_that_cannot_be_had_falls_back_to_messages_with_a_warning():
    # No tmpfs holds 2 x 2 x 1 PiB: creating the file fails, and the job goes on without it.
    env = {"RINGTRAIN_SHARED_MEMORY_BYTES": str(2**50)}
    result = check("check_engine.py", 2, env=env)
    assert "ringtrain: warning: cannot create a" in result.stderr
    assert "sends every segment as an MPI message instead" in result.stderr


@pytest.mark.parametrize("np", WORLDS)
def test_the_neutral_exchange_averages_a_step_and_fails_ranks_that_disagree_at_once(np):
    check("check_exchange.py", np)


@pytest.mark.parametrize("np", WORLDS)
def test_read_only_results_shared_by_the_host(np):
    check("check_shared_results.py", np, timeout=240)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_read_only_results_shared_when_peers_read_buffers_in_place(np):
    # Regions of 64 bytes: nearly every call reads peers' buffers in place, and leaves its
    # result in the result area all the same.
    check("check_shared_results.py", np, env={"RINGTRAIN_SHARED_MEMORY_BYTES": "64"})


@pytest.mark.parametrize("np", [2, 3])
def test_a_full_result_area_falls_back_and_overwrites_nothing_held(np):
    check("check_shared_results.py", np, env={"RINGTRAIN_SHARED_RESULT_BYTES": "65536"})


@pytest.mark.parametrize("np", [2, 3, 4])
def test_the_shared_ring_when_ranks_run_ahead(np):
    check("check_shared_ring.py", np)


@pytest.mark.parametrize("np", WORLDS)
def test_the_ring_that_reads_peers_buffers_in_place(np):
    check("check_attach_ring.py", np, timeout=240)


def _without_ptrace():
    """Return a command prefix that starts a process without CAP_SYS_PTRACE, or None."""
    if os.geteuid() != 0:
        return []  # an unprivileged process has no such capability to drop
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cross-memory attach is Linux's")
@pytest.mark.parametrize("np", [2, 3])
def test_ranks_that_may_not_read_each_other_send_large_calls_as_messages(np):
    prefix = _without_ptrace()
    if prefix is None:
        pytest.skip("running as root without setpriv (util-linux) to drop CAP_SYS_PTRACE")
    check("check_attach_refused.py", np, prefix=prefix)


@pytest.mark.parametrize("np", [2, 4])
def test_engine_calls_above_tiny_shared_regions_take_the_attach_ring(np):
    # Regions of 64 bytes: nearly every call of the checks reads peers' buffers in place.
    env = {"RINGTRAIN_SHARED_MEMORY_BYTES": "64"}
    check("check_allreduce.py", np, env=env, timeout=240)
    check("check_collectives.py", np, env=env)


@pytest.mark.parametrize("np", WORLDS)
def test_ranks_started_unbound_divide_the_cores_and_bound_ranks_stay(np):
    check("check_affinity.py", np)


@pytest.mark.parametrize("np", WORLDS)
def test_engine_async_fusion_groups_join(np):
    check("check_engine.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_tensors_of_a_ring_chunk_or_more_skip_the_fusion_buffer(np):
    # 1 KiB chunks: of the tensors submitted together, the larger go through the ring alone,
    # read in place (or staged alone, from the device or widened), beside the smaller that
    # share a fusion buffer; groups split across both, and joined ranks fuse everything.
    env = {"RINGTRAIN_RING_CHUNK_BYTES": "1024"}
    check("check_engine.py", np, env=env)
    check("check_device_arrays.py", np, env={**env, "NUMBA_ENABLE_CUDASIM": "1"}, timeout=180)


@pytest.mark.parametrize("np", WORLDS)
def test_adasum(np):
    check("check_adasum.py", np, timeout=240)


@pytest.mark.parametrize("np", WORLDS)
def test_process_sets(np):
    # Calls that ranks name differently would stall: stop such a job within seconds.
    env = {"RINGTRAIN_STALL_CHECK_SECONDS": "2", "RINGTRAIN_STALL_SHUTDOWN_SECONDS": "10"}
    check("check_process_sets.py", np, env=env, timeout=240)


@pytest.mark.parametrize("np", WORLDS)
def test_withdrawals_racing_responses_free_their_names_on_every_rank(np):
    env = {"RINGTRAIN_STALL_CHECK_SECONDS": "2", "RINGTRAIN_STALL_SHUTDOWN_SECONDS": "10"}
    check("check_withdraw.py", np, env=env, timeout=120)


@pytest.mark.parametrize("np", WORLDS)
def test_other_collectives(np):
    check("check_collectives.py", np)


@pytest.mark.parametrize("np", WORLDS)
def test_error_paths(np):
    check("check_errors.py", np)


# The engine's drift and stall checks run at 2-4 ranks in one process too
# (test_engines_in_memory.py); these runs check them through the API and under mpirun.
@pytest.mark.parametrize("np", [3])
def test_unnamed_calls_that_drift_apart_fail_naming_each_ranks_call_site(np):
    """Also: async unnamed calls at different speeds pair right; integer Average truncates."""
    env = {"RINGTRAIN_UNNAMED_DRIFT_SECONDS": "1", "RINGTRAIN_STALL_SHUTDOWN_SECONDS": "60"}
    check("check_drift.py", np, env=env, timeout=180)


@pytest.mark.parametrize("np", [3])
def test_stall_warns_then_fails_only_the_stalled_tensors(np):
    result = check("check_stall.py", np, 3.0, timeout=120)
    assert "ringtrain: warning: tensor 'lonely' has waited" in result.stderr
    assert f"for ranks [{np - 1}]" in result.stderr
    assert "ringtrain: error: failing a stalled tensor: stall shutdown after 3 s" in result.stderr
    for r in range(np):
        assert f"rank {r}: StallError after" in result.stdout
        assert f"rank {r}: carried on" in result.stdout


def test_timeline_is_valid_json_with_every_phase(tmp_path):
    path = tmp_path / "timeline.json"
    check("check_timeline.py", 2, env={"RINGTRAIN_TIMELINE": str(path)})
    events = json.loads(path.read_text())
    phases = {e["name"] for e in events if e["ph"] != "M"}
    assert {
        "ENQUEUE",
        "NEGOTIATE",
        "WAIT_FOR_OTHER_RANKS",
        "MEMCPY_IN_FUSION_BUFFER",
        "REDUCE_SCATTER",
        "ALLGATHER",
        "MEMCPY_OUT_FUSION_BUFFER",
    } <= phases
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"layer0", "layer1", "layer2", "layer3", "gathered"} <= tracks
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0


@pytest.mark.parametrize("np", [1, 2, 3])
def test_timeline_started_and_stopped_while_running(np, tmp_path):
    check("check_timeline_calls.py", np, tmp_path)
    if np > 1:  # rank 0 alone writes a path without {rank}
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("first")) == [
            "first.json"
        ]


def test_timeline_per_rank_files(tmp_path):
    check("check_timeline.py", 2, env={"RINGTRAIN_TIMELINE": str(tmp_path / "t{rank}.json")})
    for r in range(2):
        assert json.loads((tmp_path / f"t{r}.json").read_text())


def test_bad_setting_fails_fast_with_its_name():
    result = run("check_timeline.py", 1, env={"RINGTRAIN_CYCLE_TIME": "soon"}, timeout=60)
    assert result.returncode != 0
    assert "bad value 'soon' for RINGTRAIN_CYCLE_TIME" in result.stderr


@pytest.mark.parametrize("np", [1, 3, 4])
def test_init_on_rank_lists_and_user_communicators(np):
    check("check_init.py", np)


@pytest.mark.parametrize("np", [1, 2, 3])
def test_device_arrays_through_the_engine_in_the_cuda_simulator(np):
    check("check_device_arrays.py", np, env={"NUMBA_ENABLE_CUDASIM": "1"}, timeout=180)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_device_arrays_go_to_mpi_itself_where_it_takes_device_memory(np):
    # The simulator's device memory is host memory, which any MPI takes: this checks the
    # route (ops, scaling, the compressed calls still staged), not MPI's CUDA support.
    env = {"NUMBA_ENABLE_CUDASIM": "1", "RINGTRAIN_CUDA_AWARE_MPI": "1"}
    check("check_device_arrays.py", np, env=env, timeout=180)


# One rank (the local route) and three (uneven splits): the way back is the same at every
# size, and each run starts PyTorch and JAX on every rank (20-30 s in the suite).
@pytest.mark.parametrize("np", [1, 3])
def test_torch_tensors_and_jax_arrays_come_back_as_their_own_kind(np):
    check("check_interop.py", np, timeout=240)


@pytest.mark.skipif(not cuda_built(), reason="numba finds no GPU here (CI has none)")
@pytest.mark.parametrize("np", WORLDS)
def test_torch_and_cupy_gpu_arrays_come_back_on_the_gpu_as_their_own_kind_on_a_gpu(np):
    check("check_interop.py", np, env={"RINGTRAIN_CHECK_CUDA": "1"}, timeout=240)


@pytest.mark.skipif(not cuda_built(), reason="numba finds no GPU here (CI has none)")
@pytest.mark.parametrize("np", WORLDS)
def test_device_arrays_through_the_engine_on_a_gpu(np):
    # Every rank on the one GPU; 1 KiB chunks also send the larger tensors alone.
    check("check_device_arrays.py", np, env={"RINGTRAIN_RING_CHUNK_BYTES": "1024"}, timeout=180)


def test_init_has_open_mpi_send_a_ring_chunk_eagerly_unless_the_user_says_otherwise():
    # Over TCP alone, as between hosts: a 1 MiB chunk's send completes before its receive
    # is posted. A limit the user gives (here Open MPI's own 64 KiB) wins, and the send waits.
    tcp = {"OMPI_MCA_btl": "tcp,self"}
    check("check_eager.py", 2, "eager", env=tcp, timeout=60)
    check("check_eager.py", 2, "default", env={**tcp, EAGER_LIMIT_VARIABLE: "65536"}, timeout=60)


@pytest.mark.parametrize("np", [3, 4])
def test_hierarchical_allreduce_on_one_host(np):
    env = {"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "1"}
    check("check_allreduce.py", np, env=env, timeout=240)
    check("check_engine.py", np, env=env)


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_large_calls_across_hosts_choose_one_chunk_on_every_rank(np):
    # -np 1 is one host, where nothing crosses a link: the check expects no choice there.
    check("check_link_chunk.py", np, timeout=240)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_autotune_switches_settings_mid_run_and_every_result_stays_right(np, tmp_path):
    # -np 2 on this host; 3 and 4 on pretend hosts of two, where hierarchical is tuned too.
    check("check_autotune.py", np, tmp_path, "tuned", timeout=240)


def test_autotune_leaves_a_ring_chunk_the_user_set_alone(tmp_path):
    # On pretend hosts of two, where the chunk trial runs beside the tuner.
    check("check_autotune.py", 4, tmp_path, "user-chunk", timeout=240)


@pytest.mark.parametrize("np", [3, 4])
def test_engines_in_turn_in_one_process_leave_nothing_stale_for_the_next(np):
    # Hierarchical on pretend hosts of two, where a heartbeat sent after an engine's last
    # message hung a later engine about one launch in two at -np 4.
    check("check_engines_in_turn.py", np, timeout=120)


@pytest.mark.parametrize("np", [2, 3, 4, 6])
def test_hierarchical_allreduce_on_pretend_hosts(np):
    # -np 2: hosts of 1; 3: hosts of 2 and 1, through each host's first rank; 4 and 6: hosts
    # of 2 and of 3, each rank fed its segment by its host's ranks while its ring crosses.
    check("check_hierarchical_hosts.py", np, timeout=240)


@pytest.mark.parametrize("np", [4, 6])
def test_a_hosts_results_arrive_when_every_receive_is_posted_late(np):
    # Hung about one 2 x 2 cluster benchmark launch in 20: every rank of a host waited for
    # its own results to go before posting the receives of the others'.
    check("check_late_results.py", np, timeout=120)


def test_a_burst_of_small_tensors_is_fused_into_few_ring_passes(tmp_path):
    path = tmp_path / "timeline.json"
    check("check_timeline.py", 2, env={"RINGTRAIN_TIMELINE": str(path)})
    passes = {
        ts for name, ts in _ring_passes(json.loads(path.read_text())) if re.fullmatch(r"t\d+", name)
    }
    # 60 tensors submitted at once; fusion puts many of them into each ring pass.
    assert 1 <= len(passes) < 30, f"{len(passes)} ring passes for 60 tensors"


def test_tensors_of_a_ring_chunk_or_more_go_through_the_ring_alone(tmp_path):
    path = tmp_path / "timeline.json"
    env = {"RINGTRAIN_TIMELINE": str(path), "RINGTRAIN_RING_CHUNK_BYTES": "1024"}
    check("check_timeline.py", 2, env=env)
    passes = _ring_passes(json.loads(path.read_text()))
    small = {ts for name, ts in passes if re.fullmatch(r"s\d", name)}
    for big in ("b0", "b1"):
        (mine,) = [ts for name, ts in passes if name == big]
        assert all(ts != mine for name, ts in passes if name != big), f"{big} was fused"
    # The small ones submitted with them still share fusion buffers.
    assert 1 <= len(small) < 8, f"{len(small)} ring passes for 8 small tensors"


def _lasting(paths, seconds=5.0):
    """Return those of ``paths`` still there ``seconds`` from now (none once all are gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(os.path.exists(p) for p in paths):
        time.sleep(0.1)
    return {p for p in paths if os.path.exists(p)}


def _ring_passes(events):
    """Return (tensor name, start of its reduce-scatter) for every ring pass of a timeline."""
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    return [(tracks[e["tid"]], e["ts"]) for e in events if e["name"] == "REDUCE_SCATTER"]


@pytest.mark.parametrize("np", [2, 3])
def test_a_rank_that_raises_stops_the_others_instead_of_hanging(np):
    before = set(glob.glob("/dev/shm/ringtrain-*"))
    result = run("check_rank_exit.py", np, timeout=60)
    assert result.returncode != 0
    # The shared-memory file is unlinked once mapped: an aborted job leaves nothing behind.
    # (A job of a test running beside this one has its own file for a moment only.)
    assert not _lasting(set(glob.glob("/dev/shm/ringtrain-*")) - before)
    assert f"RuntimeError: rank {np - 1} fails on purpose" in result.stderr
    for r in range(np - 1):
        assert (
            f"rank {r}: EngineStoppedError: the ringtrain engine has stopped: rank {np - 1} "
            "shut ringtrain down" in result.stdout
        ), result.stdout


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_blocking_calls_run_the_engine_in_the_caller_and_hand_it_back(np):
    result = check("check_drive.py", np, timeout=120)
    assert result.stdout.count(": OK") == np


@pytest.mark.parametrize("mode", ["caller", "engine"])
@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_a_failure_while_running_a_response_ends_the_job(np, mode):
    result = run("check_engine_failure.py", np, mode, timeout=60)
    assert result.returncode != 0
    assert f"RuntimeError: rank {np - 1} fails on purpose" in result.stderr, result.stderr
    assert "returned from a call" not in result.stdout
    # An async call is run by the engine thread. A blocking call's caller takes the turns only
    # if the engine thread is not inside one at that moment, and gives them back after a spin
    # without progress (one rank always leaves them to the engine thread): on a loaded machine
    # either thread may run the failing response, and the message must name the one that did.
    where = (
        "its own thread"
        if mode == "engine"
        else ("(its own thread|thread 'MainThread', which waits for its call)")
    )
    assert re.search(f"rank {np - 1}: the engine failed in {where}", result.stderr), result.stderr
    assert "aborting the job so no rank hangs in a collective" in result.stderr


@pytest.mark.parametrize(
    ("np", "mode", "victim", "shared"),
    [
        (3, "stop", 2, True),
        (3, "stop-mid", 0, True),
        (4, "stop", 0, True),
        (4, "stop-mid", 1, True),
        # In the message ring each rank waits for its left neighbour: rank 3 for rank 2,
        # which waits for the frozen rank 1, and may time out first, naming rank 2.
        (4, "stop-mid", 1, False),
    ],
)
def test_every_other_rank_reports_a_frozen_rank_and_the_job_ends(np, mode, victim, shared):
    """The victim freezes (SIGSTOP) before it submits, or mid-transfer, at step 3.

    Every other rank prints its own error naming it; only it is blamed (unreachable lines);
    the job ends within the timeout plus 30 s, and no rank is left running, frozen or not.
    """
    env = {"RINGTRAIN_COLLECTIVE_TIMEOUT": str(_FROZEN_TIMEOUT)}
    if not shared:
        env["RINGTRAIN_SHARED_MEMORY_BYTES"] = "0"
    result = run("check_frozen_rank.py", np, mode, victim, env=env, timeout=120)
    output = _ended_soon_blaming(result, np, mode, victim)
    for rank in set(range(np)) - {victim}:
        said = [
            line
            for line in result.stderr.splitlines()
            if line.startswith(f"ringtrain: error: rank {rank} on ")
        ]
        assert any(f"rank {victim} on " in line for line in said), (rank, output)
        # ... and its own call raised it before the job ended.
        assert f"rank {rank} raised CollectiveTimeoutError: rank {rank} on " in result.stdout, (
            rank,
            output,
        )


@pytest.mark.parametrize(("np", "victim"), [(2, 0), (3, 0), (3, 2)])
def test_a_rank_frozen_at_shutdown_ends_the_job_naming_it(np, victim):
    """The victim freezes once step 3 is done, as every other rank calls shutdown().

    Rank 0 waits for its last control message, or the others for rank 0's answer to their
    shutdown: each wait fails naming the victim, in the caller's shutdown(), and the job ends.
    """
    env = {"RINGTRAIN_COLLECTIVE_TIMEOUT": str(_FROZEN_TIMEOUT)}
    result = run("check_frozen_rank.py", np, "stop-shutdown", victim, env=env, timeout=120)
    output = _ended_soon_blaming(result, np, "stop-shutdown", victim)
    # Rank 0 waits for the victim; where rank 0 is the victim, every other rank waits for it.
    waiting = [0] if victim != 0 else range(1, np)
    for rank in waiting:
        raised = re.search(rf"rank {rank} raised CollectiveTimeoutError: (.*)", result.stdout)
        assert raised and f"rank {victim} on " in raised[1] and "shutdown" in raised[1], output


_FROZEN_TIMEOUT = 3  # RINGTRAIN_COLLECTIVE_TIMEOUT of the frozen-rank tests


def _ended_soon_blaming(result, np, mode, victim):
    """Check that a ``check_frozen_rank.py`` job failed soon after ``victim`` froze.

    Only the victim is blamed (unreachable lines) and no rank is left running; returns the
    job's output, for messages.
    """
    ended = time.time()
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode != 0, output
    fault = re.search(rf"rank {victim}: {mode} at ([\d.]+)", result.stdout)
    assert fault, output
    took = ended - float(fault[1])
    assert took < _FROZEN_TIMEOUT + 30, f"ended {took:.1f} s after"
    assert set(re.findall(r"@@ringtrain-run: rank (\d+) on host", result.stderr)) == {
        str(victim)
    }, output
    pids = [int(pid) for pid in re.findall(r"rank \d pid (\d+)", result.stdout)]
    assert len(pids) == np, output
    assert not _still_running(pids, "check_frozen_rank.py")
    return output


def _still_running(pids, script, seconds=10.0):
    """Return those of ``pids`` still running ``script`` (not even a zombie) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        running = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    command = cmdline.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if state != "Z" and script.encode() in command:
                running.append(pid)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.2)


@pytest.mark.parametrize("np", [1, 2])
def test_ctrl_c_in_blocking_calls_ends_the_job(np):
    result = run("check_interrupt.py", np, timeout=60)
    assert result.returncode != 0
    inside = "the engine was interrupted in thread 'MainThread', which waits for its call"
    assert inside in result.stderr or "interrupted between turns" in result.stdout, (
        result.stdout + result.stderr
    )
