"""The benchmarks run and report every row (their figures are not asserted: speed is no test)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_launch import launch

import ringtrain
from ringtrain.bench import autotune
from ringtrain.bench.__main__ import main as bench_main
from ringtrain.runner.locate import find_mpirun


@pytest.mark.mpi
def test_allreduce_benchmark_writes_every_row_as_json(tmp_path):
    out = tmp_path / "rows.json"
    command = [
        find_mpirun(), "-np", "2", "--oversubscribe", "--bind-to", "none",
        sys.executable, "-m", "ringtrain.bench", "allreduce", "--sizes", "4096,65536",
        "--seconds", "0.05", "--small-count", "4", "--adasum", "--allgather", "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done, _ = launch(command, 120, env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert [(r["case"], r["bytes"]) for r in rows] == [
        ("single", 4096), ("single, read-only", 4096), ("allgather", 4096),
        ("single, Adasum", 4096),
        ("single", 65536), ("single, read-only", 65536), ("allgather", 65536),
        ("single, Adasum", 65536),
        ("4x16384 grouped", 4 * 16384), ("4x16384 async", 4 * 16384),
        ("4x16384 grouped, read-only", 4 * 16384), ("4x16384 async, read-only", 4 * 16384),
    ]  # fmt: skip
    for row in rows:
        assert row["ranks"] == 2 and row["ringtrain_us"] > 0 and row["mpi_us"] > 0
        assert row["busbw_ratio"] == row["mpi_us"] / row["ringtrain_us"]
        # Each rank sends (n-1)/n of the bytes once in an allgather, twice in an allreduce.
        moved = 0.5 if row["case"] == "allgather" else 1.0
        assert row["ringtrain_busbw_GBps"] == row["ringtrain_algbw_GBps"] * moved
    assert "ratio" in done.stdout and "65536" in done.stdout


@pytest.mark.mpi
def test_allreduce_benchmark_times_device_buffers_in_the_cuda_simulator(tmp_path):
    """``--device cuda``: numba's device arrays, against MPI's call staged through the host."""
    out = tmp_path / "rows.json"
    command = [
        find_mpirun(), "-np", "2", "--oversubscribe", "--bind-to", "none",
        sys.executable, "-m", "ringtrain.bench", "allreduce", "--device", "cuda", "--sizes",
        "4096", "--seconds", "0.05", "--small-count", "3", "--json", str(out),
    ]  # fmt: skip
    env = dict(
        os.environ,
        NUMBA_ENABLE_CUDASIM="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    done, _ = launch(command, 120, env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == [
        "single", "single, read-only", "3x16384 grouped", "3x16384 async",
        "3x16384 grouped, read-only", "3x16384 async, read-only",
    ]  # fmt: skip
    assert all(r["ringtrain_us"] > 0 and r["mpi_us"] > 0 for r in rows)


@pytest.mark.mpi
def test_allreduce_benchmark_adds_a_row_per_size_with_16_bit_values_on_the_wire(tmp_path):
    """... and ``--small-count 0`` leaves the many-small-tensors rows out."""
    out = tmp_path / "rows.json"
    command = [
        find_mpirun(), "-np", "2", "--oversubscribe", "--bind-to", "none",
        sys.executable, "-m", "ringtrain.bench", "allreduce", "--sizes", "4096,65536",
        "--seconds", "0.05", "--small-count", "0", "--compression", "bf16", "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done, _ = launch(command, 120, env=env)
    assert done.returncode == 0, done.stderr
    cases = [(r["case"], r["bytes"]) for r in json.loads(out.read_text())]
    assert cases == [
        ("single", 4096), ("single, read-only", 4096), ("single, bf16", 4096),
        ("single", 65536), ("single, read-only", 65536), ("single, bf16", 65536),
    ]  # fmt: skip
    assert "single, bf16" in done.stdout


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [("--small-count", "-1", "0 (no small tensors) or more, got -1"),
     ("--small-bytes", "6", "positive multiple of 4 (whole float32 values), got 6"),
     ("--small-bytes", "0", "got 0")],
)  # fmt: skip
def test_allreduce_benchmark_refuses_small_tensors_it_cannot_make_naming_the_value(
    option, value, expected, capsys
):
    with pytest.raises(SystemExit) as stopped:
        bench_main(["allreduce", option, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert option in err and expected in err


def test_kernel_benchmark_reports_each_kernel_against_a_copy():
    done = subprocess.run(
        [sys.executable, "-m", "ringtrain.bench", "kernels", "--mib", "1", "--repeats", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    for label in ("copy", "pack 200 tensors", "unpack 200", "pack float16->float32",
                  "reduce Sum"):  # fmt: skip
        assert f"{label}:" in done.stdout


@pytest.mark.mpi
def test_compare_times_checkouts_in_turns_and_gives_each_case_a_ratio(tmp_path):
    out = tmp_path / "rows.json"
    here = str(Path(ringtrain.__file__).resolve().parent.parent)
    command = [
        sys.executable, "-m", "ringtrain.bench", "compare", here, here, "-np", "2",
        "--rounds", "3", "--sizes", "4096", "--small-count", "2", "--batch-seconds", "0.01",
        "--timeout", "150", "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    cases = [("single", 4096), ("single, read-only", 4096)]
    cases += [("2x16384 grouped", 2 * 16384), ("2x16384 async", 2 * 16384)]
    assert [(r["case"], r["bytes"]) for r in rows] == cases * 2
    for row in rows:
        assert row["ranks"] == 2 and row["rounds"] == 3 and row["median_us"] > 0
    assert all(r["ratio_median"] == 1.0 for r in rows[:4])  # the first checkout against itself
    assert "B/A" in done.stdout and f"A = {here}" in done.stdout


@pytest.mark.mpi
@pytest.mark.parametrize(
    "workload, unit, peers",
    [
        (["allreduce", "--size", "65536", "--seconds", "0.05"], "calls/s", ["MPI_Allreduce"]),
        (["train", "--model", "mlp", "--batch", "8", "--steps", "2"], "samples/s", []),
    ],
    ids=["allreduce", "train"],
)
def test_autotune_benchmark_tunes_then_times_every_setting_within_one_launch(workload, unit, peers):
    command = [
        sys.executable, "-m", "ringtrain.bench", "autotune", "--workload", *workload,
        "--rounds", "1", "--blocks", "2", "--timeout", "150",
    ]  # fmt: skip
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(RINGTRAIN_AUTOTUNE_SAMPLES="3", RINGTRAIN_AUTOTUNE_STEPS_PER_SAMPLE="2")
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # 1 warm-up sample and 3 searched, then 2 * 2 that may confirm the best; 2 steps each.
    assert "tuned within 25 steps" in out and "medians over 2 blocks" in out, out
    labels = ["defaults", "autotune", autotune.DEFAULTS_AGAIN, "best fixed", autotune.HELD_OUT]
    assert all(f"  {label}" in out for label in labels + ["fusion 1 MiB, chunk"] + peers), out
    # The sweep's 8, the defaults twice, autotune, the best, the held-out pick and any peer.
    assert out.count(f" {unit}\n") == 8 + 5 + len(peers), out
    ratios = ["autotune / best fixed setting: ", f"autotune / {autotune.HELD_OUT}: "]
    ratios.append(f"{autotune.DEFAULTS_AGAIN} / defaults: ")
    ratios += [f"autotune / {peer}: " for peer in peers]
    assert all(ratio in out for ratio in ratios), out
    assert "round 1/1: autotune chose fusion_threshold=" in out, out


def test_the_sweeps_held_out_pick_in_a_block_is_chosen_on_the_other_blocks():
    # "b" has one lucky block (2): it picks "b" for the other blocks, never for itself.
    launched = {"a": [10.0, 10.0, 10.0], "b": [9.0, 9.0, 20.0], "c": [1.0, 1.0, 1.0]}
    assert autotune.held_out_picks(launched, ["a", "b", "c"]) == ["b", "b", "a"]


def test_compare_refuses_what_it_cannot_run_naming_it(tmp_path, capsys):
    here = str(Path(ringtrain.__file__).resolve().parent.parent)
    for extra, message in (
        ([here, str(tmp_path)], f"{tmp_path} holds no ringtrain package"),
        ([here], "give two or more checkouts"),
        ([here, here, "--rounds", "0"], "--rounds must be 1 or more, got 0"),
        ([here, here, "--batch-seconds", "0"], "--batch-seconds must be above 0, got 0"),
    ):
        assert bench_main(["compare", *extra]) == 2
        assert message in capsys.readouterr().out, extra


def test_negotiation_benchmark_counts_what_crosses_the_busiest_rank_on_both_paths(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["negotiation", "--ranks", "2,16,24,32", "--tensors", "5", "--steps", "2"]
    assert bench_main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["ranks"], r["path"]) for r in rows] == [
        (n, path) for n in (2, 16, 24, 32) for path in ("rounds", "metas")
    ]
    # Recursive doubling: a message out and one in per step, log2 N steps; 24 ranks fold
    # the 8 past 16 into partners first, and back after: two steps more.
    rounds = {r["ranks"]: r["messages"] for r in rows if r["path"] == "rounds"}
    assert rounds == {2: 2, 16: 8, 24: 12, 32: 10}
    for row in rows:
        assert row["cpu_us"] > 0
        if row["path"] == "metas":
            assert row["messages"] == 2 * (row["ranks"] - 1)
    by = {(r["ranks"], r["path"]): r["bytes"] for r in rows}
    assert all(by[n, "rounds"] < by[n, "metas"] for n in (16, 24, 32))
    printed = capsys.readouterr().out
    assert "rounds: the busiest rank's CPU at 32 ranks is" in printed
    assert "(log2 of the ratio of ranks: 1)" in printed
    with pytest.raises(SystemExit):
        bench_main(["negotiation", "--ranks", "1,16"])
    assert "rank counts '1,16': expected whole numbers of at least 2" in capsys.readouterr().err
