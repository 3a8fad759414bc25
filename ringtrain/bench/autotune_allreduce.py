"""``bench autotune``'s allreduce job in one launch: tune, then time every setting in turn.

Run under mpirun with autotune on and nothing remembered. The job is one allreduce of
``--size`` bytes, called again and again: each call is a step. It warms up until tuning has
ended, then times, in ``--blocks`` blocks of ``--seconds`` each: the settings it started with
(the defaults), those autotune chose, every fixed setting of the sweep
(``autotune.sweep_values``), and ``MPI_Allreduce`` of the same buffer. ringtrain's calls are
read-only, as training's are. Every rank switches to each setting together
(``Engine.switch_settings``), so launches that differ by more than the settings do (15% on a
shared machine) no longer decide the comparison. The order turns by one each block, so that
drift in the machine's speed falls on every setting alike. Rank 0 prints one result line:
the calls per second of each setting in each block, and the settings.
"""

import argparse
import json

import numpy as np

import ringtrain
from ringtrain import runtime
from ringtrain.bench.allreduce import median_time
from ringtrain.bench.autotune import MPI_LABEL, sweep_values
from ringtrain.bench.train import _MARK


def main(argv=None) -> int:
    """Tune, time each setting ``--blocks`` times, and print rank 0's result line."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench.autotune_allreduce")
    parser.add_argument("--size", type=int, required=True, help="bytes of the allreduce")
    parser.add_argument("--warmup-calls", type=int, required=True, help="at least tuning's")
    parser.add_argument("--blocks", type=int, default=5, help="times each setting is timed")
    parser.add_argument("--seconds", type=float, default=0.5, help="each setting's time a block")
    args = parser.parse_args(argv)
    ringtrain.init()  # before mpi4py.MPI is imported, so that MPI starts with its settings
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    engine = runtime.current().engine
    count = args.size // 4
    src = np.random.default_rng(comm.Get_rank()).random(count, dtype=np.float32)
    recv = np.empty(count, np.float32)

    def ours():  # read-only, as TensorFlow's optimizers take their gradients
        return ringtrain.allreduce(src, op=ringtrain.Sum, name="bench", read_only=True)

    def theirs():
        comm.Allreduce(src, recv, op=MPI.SUM)

    for _ in range(args.warmup_calls):
        ours()
    settings_of = comm.bcast(_settings_to_time(engine.tuner) if comm.Get_rank() == 0 else None)
    if settings_of is None:
        raise SystemExit(f"autotune did not finish within {args.warmup_calls} calls")
    labels = [*settings_of, MPI_LABEL]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    for block in range(args.blocks):
        turn = block % len(labels)
        for label in labels[turn:] + labels[:turn]:
            if label != MPI_LABEL and comm.Get_rank() == 0:
                engine.switch_settings(settings_of[label])
            step = theirs if label == MPI_LABEL else ours
            rates[label].append(1.0 / median_time(comm, step, args.seconds))
    got = ours()
    theirs()
    if not np.allclose(got, recv, rtol=1e-5, atol=1e-5 * comm.Get_size()):
        raise AssertionError("ringtrain's allreduce differs from MPI_Allreduce's")
    if comm.Get_rank() == 0:
        print(_MARK + json.dumps({"rates": rates, "settings": settings_of}), flush=True)
    ringtrain.shutdown()
    return 0


def _settings_to_time(tuner) -> dict | None:
    """Return the settings to time by label, or None if the tuner has not finished."""
    if tuner is None or not tuner.done or tuner.best is None:
        return None
    return {"defaults": tuner.start, "autotune": tuner.best, **sweep_values(tuner.start)}


if __name__ == "__main__":
    raise SystemExit(main())
