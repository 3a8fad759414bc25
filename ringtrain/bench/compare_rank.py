"""One rank of ``bench compare``: times the collectives of the checkout on its PYTHONPATH.

``bench compare`` runs this file by its path (``python -P``), once per checkout, so that
``import ringtrain`` finds the checkout under test rather than this one. It uses only the
public API that older checkouts share, and nothing else of ringtrain's.

The jobs of the checkouts run at once and take turns, one batch of every case at a time:
job ``k`` of ``J`` runs its batch of round ``r`` when the turn file holds ``r * J + k``,
then writes the next number there. Waiting ranks sleep between looks, so that the batch
that runs has the machine to itself, and batches next to each other in time see the same
machine: that is what makes their ratio steadier than separate runs'.
"""

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import ringtrain

_LOOK_SECONDS = 0.005  # how often a waiting rank looks whether its turn has come


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", required=True, help="the turn file the jobs share")
    parser.add_argument("--job", type=int, required=True, help="this job's number, from 0")
    parser.add_argument("--jobs", type=int, required=True, help="how many jobs take turns")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--sizes", required=True, help="comma-separated bytes")
    parser.add_argument("--small-count", type=int, required=True)
    parser.add_argument("--small-bytes", type=int, required=True)
    parser.add_argument("--batch-seconds", type=float, required=True)
    parser.add_argument("--json", required=True, help="where rank 0 writes the times")
    return parser.parse_args()


def _cases(sizes, small_count, small_bytes, rank):
    """Return (case, bytes, step) for every case timed: the allreduce benchmark's names."""
    cases = []
    for nbytes in sizes:
        src = np.full(nbytes // 4, rank + 1, np.float32)
        out = np.empty_like(src)

        def into_out(src=src, out=out):
            ringtrain.allreduce(src, op=ringtrain.Sum, out=out, name="compare")

        def read_only(src=src):
            ringtrain.allreduce(src, op=ringtrain.Sum, name="compare.ro", read_only=True)

        cases += [("single", nbytes, into_out), ("single, read-only", nbytes, read_only)]
    small = [np.full(small_bytes // 4, rank + i, np.float32) for i in range(small_count)]
    if small_count:
        for case, step in small_tensor_steps(small):
            cases.append((f"{small_count}x{small_bytes} {case}", small_count * small_bytes, step))
    return cases


def small_tensor_steps(small, read_only=False) -> list:
    """Return ("grouped", step) and ("async", step) over ``small``: one call, or one each.

    The allreduce benchmark's many-small-tensors cases too (``bench allreduce``), which also
    times them ``read_only``, as training hands gradients over; ``bench compare`` leaves
    that keyword out, since older checkouts' groups do not take it.
    """
    ro = {"read_only": True} if read_only else {}

    def grouped():
        handle = ringtrain.grouped_allreduce_async(small, op=ringtrain.Sum, name="g", **ro)
        ringtrain.synchronize(handle)

    def one_by_one():
        handles = [
            ringtrain.allreduce_async(t, op=ringtrain.Sum, name=f"small.{i}", **ro)
            for i, t in enumerate(small)
        ]
        for handle in handles:
            ringtrain.synchronize(handle)

    suffix = ", read-only" if read_only else ""
    return [(f"grouped{suffix}", grouped), (f"async{suffix}", one_by_one)]


def _calls_per_batch(comm, step, seconds) -> int:
    """Warm ``step`` up and return how many calls fill ``seconds``: the same on every rank."""
    for _ in range(3):
        step()
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(3):
        step()
    each = comm.allreduce((time.perf_counter() - started) / 3, op=MPI.MAX)
    return max(3, min(1000, int(seconds / max(each, 1e-9))))


def _wait_for_turn(comm, turns, number):
    """Return once the turn file holds ``number`` (rank 0 looks; the others sleep)."""
    if comm.Get_rank() == 0:
        while _read_turn(turns) != number:
            time.sleep(_LOOK_SECONDS)
    arrived = comm.Ibarrier()  # a blocking barrier would spin on a core the batch needs
    while not arrived.Test():
        time.sleep(_LOOK_SECONDS)


def _read_turn(turns) -> int | None:
    try:
        with open(turns, encoding="utf-8") as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None  # between a writer's replace and the file: look again


def _pass_turn(turns, number):
    """Hand the turn on: write ``number`` to the turn file in one step."""
    with open(turns + ".next", "w", encoding="utf-8") as f:
        f.write(str(number))
    os.replace(turns + ".next", turns)


def main():
    """Time every case in turns with the other jobs; rank 0 writes the per-round times."""
    args = _arguments()
    ringtrain.init()
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",") if s]
    cases = _cases(sizes, args.small_count, args.small_bytes, comm.Get_rank())
    calls = []
    rows = [[] for _ in cases]  # per case, the time of a call in each round (seconds)
    for r in range(args.rounds):
        _wait_for_turn(comm, args.turns, r * args.jobs + args.job)
        if not calls:  # the first turn warms up and sizes the batches
            calls = [_calls_per_batch(comm, step, args.batch_seconds) for _, _, step in cases]
        for (_, _, step), count, row in zip(cases, calls, rows, strict=True):
            comm.Barrier()
            started = time.perf_counter()
            for _ in range(count):
                step()
            row.append(comm.allreduce((time.perf_counter() - started) / count, op=MPI.MAX))
        comm.Barrier()
        if comm.Get_rank() == 0:
            _pass_turn(args.turns, r * args.jobs + args.job + 1)
    if comm.Get_rank() == 0:
        result = [
            {"case": case, "bytes": nbytes, "calls": count, "us": [t * 1e6 for t in row]}
            for (case, nbytes, _), count, row in zip(cases, calls, rows, strict=True)
        ]
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ranks": comm.Get_size(), "cases": result}, f)
    ringtrain.shutdown()


if __name__ == "__main__":
    main()
