"""The TensorFlow binding under a real mpirun: each test runs a script of tests/tf, with a timeout.

TensorFlow takes seconds to import per process, so each script batches many checks.
"""

import json
import os
import sys
from pathlib import Path

import bounded
import pytest
from mpi_launch import check

pytestmark = pytest.mark.mpi

pytest.importorskip("tensorflow")

SCRIPTS = Path(__file__).parent / "tf"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _check(script, np, *args, env=None, timeout=240):
    # mpi_launch joins onto tests/mpi, and an absolute path replaces that folder.
    return check(str(SCRIPTS / script), np, *args, timeout=timeout, env={**QUIET, **(env or {})})


@pytest.mark.parametrize("np", [1, 2, 3])
def test_collectives_gradients_sparse_and_mismatches(np):
    # TensorFlow's default inter-op thread pool.
    _check("check_tf_collectives.py", np)


@pytest.mark.parametrize(
    ("script", "np"), [("check_tf_collectives.py", 3), ("check_tf_horovod.py", 2)]
)
def test_the_hand_over_through_dlpack_with_cpu_tensors(script, np):
    # The hand-over meant for GPU tensors (tf.py_function and DLPack, RINGTRAIN_TF_DLPACK),
    # run here on CPU tensors: CI has no GPU, and the lent one has no TensorFlow. Horovod's
    # semantics include the eager error types.
    _check(script, np, env={"RINGTRAIN_TF_DLPACK": "1"})


def test_compression_sends_16_bit_values_within_the_bound():
    # Gradients of the tape and of DistributedOptimizer with fp16 and bf16 on the wire.
    _check("check_tf_compression.py", 2)


@pytest.mark.parametrize("np", [2, 3])
def test_horovod_semantics(np):
    # Gradients, alltoall, dtypes, error types, scale factors and API as Horovod defines them.
    _check("check_tf_horovod.py", np)


@pytest.mark.parametrize("np", [2, 3])
def test_unnamed_calls_that_drift_apart_fail_naming_each_ranks_call_site(np):
    # Eagerly and inside tf.function; the errors come within seconds, not a hang.
    _check("check_tf_drift.py", np, env={"RINGTRAIN_UNNAMED_DRIFT_SECONDS": "1"})


@pytest.mark.parametrize(("np", "inter_op"), [(1, 1), (2, 1), (2, 0), (3, 1), (4, 1)])
def test_sync_batch_normalization(np, inter_op):
    # Batches of 4, 1, 0 and 6 rows on ranks 0-3; inter_op 0 is TensorFlow's default pool.
    _check("check_tf_sync_batch_norm.py", np, "--inter-op", str(inter_op))


@pytest.mark.parametrize(("np", "inter_op"), [(1, 1), (2, 1), (2, 0), (3, 1), (4, 1)])
def test_local_sources_and_layers(np, inter_op):
    # Rows 4, 1, 0 and 6 on ranks 0-3 for the tape; inter_op 0 is TensorFlow's default pool.
    _check("check_tf_local.py", np, "--inter-op", str(inter_op))


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_process_sets(np):
    # Sites that ranks name differently would stall: stop such a job within seconds.
    env = {"RINGTRAIN_STALL_CHECK_SECONDS": "2", "RINGTRAIN_STALL_SHUTDOWN_SECONDS": "10"}
    _check("check_tf_process_sets.py", np, "--inter-op", "1", env=env)


def test_equivalence_optimizers_callbacks_saving_one_inter_op_thread(tmp_path):
    _check("check_tf_train.py", 2, "--inter-op", "1", "--dir", tmp_path, timeout=300)


@pytest.mark.parametrize("inter_op", [1, 2])
def test_backprop_overlaps_the_exchange(tmp_path, inter_op):
    timeline = str(tmp_path / "timeline-{rank}.json")
    result = _check(
        "check_tf_overlap.py",
        2,
        "--inter-op",
        str(inter_op),
        env={"RINGTRAIN_TIMELINE": timeline},
    )
    assert result.stdout.count("overlapped steps") == 2, result.stdout


def test_training_benchmark_reports_every_contender(tmp_path):
    out = tmp_path / "rows.json"
    command = [
        sys.executable, "-m", "ringtrain.bench", "train", "--models", "mlp", "--steps", "4",
        "--warmup", "2", "--timeout", "150", "--inter-op-threads", "1", "--rounds", "1",
        "--json", str(out),
    ]  # fmt: skip
    done, _ = bounded.run(command, 300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "one intra-op thread and 1 inter-op per rank" in done.stdout, done.stdout
    # One round (medians over rounds: test_tf_unit.py).
    assert "mlp round 1/1, samples/s: one process" in done.stdout, done.stdout
    rows = json.loads(out.read_text())
    assert [r["contender"] for r in rows] == [
        "one process",
        "one process, model.fit",
        "2 independent processes",
        "ringtrain -np 2",
        "ringtrain -np 2, model.fit",
        "Horovod's way (one MPI_Allreduce), -np 2",
        "MultiWorkerMirroredStrategy, 2 workers",
    ]
    assert all(r["samples_per_sec"] > 0 for r in rows)
    assert all(len(r["per_round_samples_per_sec"]) == 1 for r in rows), rows
    assert 0 <= rows[3]["hidden_fraction"] <= 1
    assert rows[1]["scaling_ratio"] == 1.0, rows  # model.fit's own baseline
    # Where the kernel keeps scheduler statistics, the custom step's contenders report their
    # CPU per step.
    if os.path.exists("/proc/self/schedstat"):
        assert "CPU ms per step" in done.stdout, done.stdout
        assert all(rows[k]["cpu_ms_per_step"]["tensorflow"] > 0 for k in (0, 2, 3, 5, 6)), rows
        assert rows[3]["cpu_ms_per_step"]["other"] > 0, rows  # ringtrain's engine
        # model.fit is timed per batch only
        assert rows[1]["cpu_ms_per_step"] is rows[4]["cpu_ms_per_step"] is None, rows
    # Every contender's processes ran with the thread setting asked for.
    assert all(r["inter_op_threads"] == [1] for r in rows), rows
    # Processes that ran at once divided the cores; the one process had them all.
    cpus = len(os.sched_getaffinity(0))
    assert [r["cpus_per_process"] for r in rows[:2]] == [[cpus], [cpus]], rows
    for row in rows[2:]:
        assert all(0 < c < cpus or c == cpus == 1 for c in row["cpus_per_process"]), rows
