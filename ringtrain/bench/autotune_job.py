"""``bench autotune``'s job in one launch: tune, then time every setting in turn.

Run under mpirun with autotune on and nothing remembered. The job is ``bench train``'s
ringtrain contender (``--workload train``: the custom train step of ``--model``, samples/s)
or one allreduce of ``--size`` bytes called again and again, each call a step (calls/s;
read-only, as training's are). It runs ``--warmup`` steps, longer than tuning takes, then
times, in ``--blocks`` blocks: the settings it started with (the defaults), those autotune
chose, the defaults again under a second label, every fixed setting of the sweep
(``autotune.sweep_values``), and, for the allreduce, ``MPI_Allreduce`` of the same buffer.
Every rank switches to each setting together (``Engine.switch_settings``), so launches that
differ by more than the settings do (15% on a shared machine) no longer decide the
comparison. The order turns by one each block, so that drift in the machine's speed falls
on every setting alike. Rank 0 prints one result line: each setting's rate in each block,
and the settings.
"""

import argparse
import hashlib
import json
import time

import numpy as np

import ringtrain
from ringtrain import runtime
from ringtrain.bench import train
from ringtrain.bench.allreduce import median_time
from ringtrain.bench.autotune import DEFAULTS_AGAIN, MPI_LABEL, SWEEP, sweep_values


def main(argv=None) -> int:
    """Tune, time each setting ``--blocks`` times, and print rank 0's result line."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench.autotune_job")
    parser.add_argument("--workload", choices=["train", "allreduce"], required=True)
    parser.add_argument("--model", default="mlp", help="train: bench train's model")
    parser.add_argument("--batch", type=int, default=64, help="train: per rank")
    parser.add_argument("--size", type=int, default=1 << 20, help="allreduce: bytes")
    parser.add_argument("--warmup", type=int, required=True, help="steps, at least tuning's")
    parser.add_argument("--blocks", type=int, default=5, help="times each setting is timed")
    parser.add_argument("--steps", type=int, default=30, help="train: steps timed each time")
    parser.add_argument("--seconds", type=float, default=0.5, help="allreduce: time each time")
    args = parser.parse_args(argv)
    job = TrainJob(args) if args.workload == "train" else AllreduceJob(args)
    from mpi4py import MPI  # after the job's init(), so that MPI starts with its settings

    comm = MPI.COMM_WORLD
    engine = runtime.current().engine
    for _ in range(args.warmup):
        job.step()
    settings_of = comm.bcast(
        _settings_to_time(engine.tuner, args.warmup) if comm.Get_rank() == 0 else None
    )
    if isinstance(settings_of, str):
        raise SystemExit(settings_of)
    labels = [*settings_of, *job.peers]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    for block in range(args.blocks):
        first = block % len(labels)
        for label in labels[first:] + labels[:first]:
            if label in settings_of and comm.Get_rank() == 0:
                engine.switch_settings(settings_of[label])
            rates[label].append(job.rate(label))
    job.check()
    if comm.Get_rank() == 0:
        print(train._MARK + json.dumps({"rates": rates, "settings": settings_of}), flush=True)
    ringtrain.shutdown()
    return 0


class AllreduceJob:
    """One allreduce of ``args.size`` bytes; ``MPI_Allreduce`` of it is timed beside."""

    peers = (MPI_LABEL,)

    def __init__(self, args):
        ringtrain.init()
        from mpi4py import MPI

        self._comm, self._seconds = MPI.COMM_WORLD, args.seconds
        count = args.size // 4
        self._src = np.random.default_rng(self._comm.Get_rank()).random(count, dtype=np.float32)
        self._recv = np.empty(count, np.float32)

        def step():
            return ringtrain.allreduce(self._src, op=ringtrain.Sum, name="bench", read_only=True)

        def mpi_step():
            self._comm.Allreduce(self._src, self._recv, op=MPI.SUM)

        self.step, self._mpi_step = step, mpi_step

    def rate(self, label) -> float:
        """Return the calls per second under the settings of ``label`` (collective)."""
        step = self._mpi_step if label == MPI_LABEL else self.step
        return 1.0 / median_time(self._comm, step, self._seconds)

    def check(self) -> None:
        """Raise AssertionError unless ringtrain's sum equals ``MPI_Allreduce``'s."""
        got = self.step()
        self._mpi_step()
        atol = 1e-5 * self._comm.Get_size()
        if not np.allclose(got, self._recv, rtol=1e-5, atol=atol):
            raise AssertionError("ringtrain's allreduce differs from MPI_Allreduce's")


class TrainJob:
    """``bench train``'s ringtrain contender: the custom train step of ``args.model``."""

    peers = ()

    def __init__(self, args):
        import keras
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        import ringtrain.tensorflow.keras as hvd

        hvd.init()
        keras.utils.set_random_seed(0)
        self._samples = args.batch * hvd.size()
        self._steps = args.steps
        x, y, build = train._model_and_data(args.model, args.batch)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
        self._model = build()
        self.step = train._local_step(self._model, optimizer, x, y)

    def rate(self, label) -> float:
        """Return the samples per second, every rank's, of ``--steps`` steps after two more."""
        for _ in range(2):  # the first runs as the settings switch
            self.step()
        started = time.perf_counter()
        for _ in range(self._steps):
            self.step()
        return self._samples * self._steps / (time.perf_counter() - started)

    def check(self) -> None:
        """Raise AssertionError unless every rank's model has the same weights, bit for bit."""
        from mpi4py import MPI

        weights = b"".join(np.asarray(w).tobytes() for w in self._model.get_weights())
        digests = MPI.COMM_WORLD.allgather(hashlib.sha256(weights).hexdigest())
        if len(set(digests)) != 1:
            raise AssertionError(f"the ranks' models differ after the timed steps: {digests}")


def _settings_to_time(tuner, warmup: int) -> dict | str:
    """Return the settings to time by label, or why there are none after ``warmup`` steps."""
    if tuner is None or not tuner.done or tuner.best is None:
        return f"autotune did not finish within {warmup} steps"
    held = [field for field in SWEEP if field not in tuner.fields]
    if held:
        return (
            f"the sweep switches {', '.join(held)}, which this job does not tune (the user "
            "set them): unset them to run this benchmark"
        )
    return {
        "defaults": tuner.start,
        "autotune": tuner.best,
        DEFAULTS_AGAIN: tuner.start,
        **sweep_values(tuner.start),
    }


if __name__ == "__main__":
    raise SystemExit(main())
