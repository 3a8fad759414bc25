"""Training throughput on Keras's JAX and PyTorch backends: ``bench train --backend jax|torch``.

Every contender runs ``model.fit`` with SGD on the same model and per-rank batch (one batch,
repeated), as its own processes with ``KERAS_BACKEND`` set and one math thread per process:

- ``one process``: the scaling baseline;
- ``N independent processes`` at once that never communicate: this machine's ceiling;
- ``ringtrain -np N``: ``ringtrain.keras.DistributedOptimizer``; a second run records a
  timeline, whose steps give the hidden fraction as ``python -m ringtrain.timeline`` does;
- ``keras DataParallel``: Keras's own ``keras.distribution.DataParallel`` over N CPU devices
  of one process (JAX only: Keras 3.15 has it for JAX alone), with the N ranks' global batch.

The table gives medians over ``--rounds`` of samples/sec and of each ratio taken within a
round: against one process, and against DataParallel where it runs.
"""

import json
import os
import statistics
import sys
import time

import numpy as np

from ringtrain import affinity, settings
from ringtrain.bench.train import (
    _MARK,
    _model_and_data,
    _runner,
    hidden_at,
    launch,
    measure_rounds,
    write_json,
)

BACKENDS = ("jax", "torch")


def run(args) -> int:
    """Run every contender on every model; print the table."""
    rows = []
    for model in args.models.split(","):
        rows.extend(summarize(model.strip(), measure_rounds(args, model.strip(), _measure_round)))
    print_rows(rows, args)
    write_json(args, rows)
    return 0


def worker_command(args, worker, model):
    """Return the command of one process of contender ``worker`` on ``model``."""
    return [
        sys.executable, "-m", "ringtrain.bench", "train", "--backend", args.backend,
        "--worker", worker, "--model", model, "--batch", str(args.batch), "--np", str(args.np),
        "--steps", str(args.steps), "--warmup", str(args.warmup),
    ]  # fmt: skip


def _measure_round(args, model):
    """Run every contender once; return their samples/sec and ringtrain's hidden fraction."""
    n, env = args.np, {"KERAS_BACKEND": args.backend}
    alone = launch([worker_command(args, "alone", model)], args.timeout, [env])[0]
    command = worker_command(args, "alone", model)
    independent = launch(
        [[*command, "--index", str(i), "--processes", str(n)] for i in range(n)],
        args.timeout,
        [env] * n,
    )
    ringtrain_command = worker_command(args, "ringtrain", model)
    ringtrain = launch([_runner(n, ringtrain_command)], args.timeout, [env])[0]
    hidden = hidden_at(n, ringtrain_command, args.timeout, env)
    rates = {
        "one process": alone["samples_per_sec"],
        f"{n} independent processes": sum(r["samples_per_sec"] for r in independent),
        f"ringtrain -np {n}": ringtrain["samples_per_sec"],
    }
    if args.backend == "jax":
        devices = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", **env}
        parallel = launch([worker_command(args, "dataparallel", model)], args.timeout, [devices])
        rates[f"keras DataParallel, {n} devices"] = parallel[0]["samples_per_sec"]
    return {"rates": rates, "hidden": hidden}


def summarize(model, rounds):
    """Return one row per contender: medians over ``rounds`` of its rate and ratios."""
    names = list(rounds[0]["rates"])
    parallel = next((name for name in names if "DataParallel" in name), None)
    rows = []
    for name in names:
        hidden = [r["hidden"][name] for r in rounds if name in r["hidden"]]
        rows.append(
            {
                "model": model,
                "contender": name,
                "samples_per_sec": statistics.median(r["rates"][name] for r in rounds),
                "scaling_ratio": statistics.median(
                    r["rates"][name] / r["rates"]["one process"] for r in rounds
                ),
                "vs_dataparallel": (
                    statistics.median(r["rates"][name] / r["rates"][parallel] for r in rounds)
                    if parallel
                    else None
                ),
                "hidden_fraction": statistics.median(hidden) if hidden else None,
            }
        )
    return rows


def print_rows(rows, args):
    """Print the table of ``rows`` (``summarize``'s)."""
    print(
        f"Keras on {args.backend}, model.fit, SGD, batch {args.batch} per rank, one math thread "
        f"per process; samples/sec over all ranks (np={args.np})"
    )
    if args.rounds > 1:
        print(f"medians of {args.rounds} rounds; each ratio is taken within a round")
    print(f"{'model':<6} {'contender':<32} {'samples/s':>10} {'ratio':>6} {'vs DP':>6} hidden")
    for r in rows:
        hidden = "" if r["hidden_fraction"] is None else f"{r['hidden_fraction']:.0%}"
        versus = "" if r["vs_dataparallel"] is None else f"{r['vs_dataparallel']:.2f}"
        print(
            f"{r['model']:<6} {r['contender']:<32} {r['samples_per_sec']:>10.0f} "
            f"{r['scaling_ratio']:>6.2f} {versus:>6} {hidden}"
        )


# -- a contender's process -------------------------------------------------------------


def work(args) -> int:
    """Run one contender's process (``--worker``) and print its result."""
    _one_math_thread(args.backend)
    import keras

    if args.worker != "ringtrain" and settings.read().bind_cores:
        affinity.pin_share(args.index, args.processes)  # as ringtrain's ranks do at init()
    replicas, reporting = 1, True
    if args.worker == "ringtrain":
        import ringtrain.keras as hvd

        hvd.init(timeline=args.timeline)
        replicas, reporting = hvd.size(), hvd.rank() == 0
    elif args.worker == "dataparallel":
        devices = keras.distribution.list_devices("cpu")
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        replicas = len(devices)
    keras.utils.set_random_seed(0)
    batch = args.batch * (replicas if args.worker == "dataparallel" else 1)
    x, y, build = _model_and_data(args.model, batch)
    model, optimizer = build(), keras.optimizers.SGD(0.01)
    if args.worker == "ringtrain":
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    times = []
    clock = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: times.append(time.perf_counter())
    )
    repeats = args.warmup + args.steps
    model.fit(
        np.tile(x, (repeats,) + (1,) * (x.ndim - 1)),
        np.tile(y, repeats),
        batch_size=batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[clock],
    )
    seconds = float(np.mean(np.diff(times[args.warmup :])))
    result = {"samples_per_sec": replicas * args.batch / seconds}
    if args.worker == "ringtrain":
        rank = hvd.rank()
        hvd.shutdown()  # closes the timeline
        if args.timeline:
            result["hidden_fraction"] = _hidden(args.timeline.format(rank=rank), args.warmup)
    if reporting:
        print(_MARK + json.dumps(result), flush=True)
    return 0


def _one_math_thread(backend):
    """Give the backend's math one thread (before it is imported): ranks share the cores."""
    if backend == "jax":
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)


def _hidden(path, warmup):
    """Return the median hidden fraction of the steps after ``warmup`` in timeline ``path``."""
    from ringtrain.timeline import steps, trace

    found = steps.split(trace.load(path)).steps[warmup:]
    fractions = [s.hidden_fraction for s in found if s.hidden_fraction is not None]
    return statistics.median(fractions) if fractions else None
