"""Training throughput: one process, ringtrain at -np N, and MultiWorkerMirroredStrategy.

``python -m ringtrain.bench train`` starts every contender as its own processes, one after
the other, with the same model, per-rank batch, data and threads (one intra-op thread per
rank; inter-op threads as ``--inter-op-threads`` says, TensorFlow's default unless given;
processes that run at once divide the cores between them, as ringtrain's ranks do unless
``RINGTRAIN_BIND_CORES`` is off), and prints samples/sec, the ratios and ringtrain's
hidden-communication fraction:

- ``alone``: one process (the scaling baseline), with the custom train step and in
  ``model.fit``;
- ``independent``: N processes at once that never communicate (this machine's ceiling);
- ``ringtrain``: N ranks, ``DistributedOptimizer`` in a ``tf.function`` train step, and in
  ``model.fit``;
- ``packed``: Horovod's way, N ranks whose step packs its gradients into one buffer for one
  ``MPI_Allreduce`` once backprop has ended (``HOROVOD``);
- ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy``, N workers on localhost.

With ``--hosts H`` (root) the contenders run across H test hosts instead, one rank each,
with each host's link capped at every rate of ``--rates`` in turn (``bench.train_cluster``).

Every contender runs with TensorFlow's pooling CPU allocator, which ``ringtrain.tensorflow``
asks for (``ringtrain.tf_allocator``). All but the ``model.fit`` rows run the same custom
train step, because Keras 3.15's ``model.fit`` fails under a multi-worker strategy (its
symbolic build reduces the first batch). ``model.fit`` pays Keras's own work per batch, so
ringtrain's ``model.fit`` row takes its scaling ratio against one process's ``model.fit``.
The hidden fraction is 1 - exposed / total communication time, from a separate ringtrain run
with a timeline: per step, the engine's work on each fused reduction (copy in, ring, copy
out) is communication, and the part after the last gradient was handed over is exposed.

A second table gives, per contender that runs the custom step, the CPU time its first
process's threads took per step (``ringtrain.bench.thread_cpu``): TensorFlow's, the main
thread's, and the others' (ringtrain's engine). Where every core is busy, a step costs what
that CPU costs, and CPU time drifts less than samples/sec.

A shared machine's speed drifts by tens of percent over minutes, so every contender runs
once per round (``--rounds``, default 3), and the table gives medians over the rounds: of
samples/sec, of the hidden fraction, and of each ratio taken within one round, against that
round's own one process (with the same kind of step) and MultiWorkerMirroredStrategy.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from ringtrain import affinity, settings, tf_allocator
from ringtrain.bench import thread_cpu

_MARK = "RESULT "
# keras.applications models by their --models names: 214 and 158 gradients a step, as real
# models hand over, built untrained (nothing is downloaded).
_APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
_SITE = "DistributedOptimizer."
# Horovod's way of exchanging a step's gradients: one MPI_Allreduce of a packed buffer.
HOROVOD = "Horovod's way (one MPI_Allreduce)"


def add_arguments(parser) -> None:
    """Declare this benchmark's options on ``parser``."""
    parser.add_argument(
        "--models",
        default="mlp,cnn",
        help="comma-separated: mlp, cnn, resnet50, mobilenetv2 (keras.applications at 32x32)",
    )
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default="tensorflow",
        help="the Keras backend; jax and torch run bench.train_backends' contenders "
        "(default tensorflow)",
    )
    parser.add_argument("--batch", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--np", type=int, default=2, help="ranks and workers (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="timed steps (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps (default 30)")
    parser.add_argument(
        "--rounds",
        type=_at_least(1),
        default=3,
        help="times every contender runs; the table gives medians (default 3)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="per launch, in seconds")
    parser.add_argument(
        "--inter-op-threads",
        type=_at_least(0),
        default=0,
        help="TensorFlow inter-op threads per process, the same for every contender "
        "(default 0: TensorFlow's choice, one per core)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument(
        "--hosts",
        type=_at_least(0),
        default=0,
        help="0 (default): every process on this machine; 2 or more: that many network-"
        "namespace test hosts, one rank each, links capped at each of --rates (root)",
    )
    parser.add_argument(
        "--rates",
        default="1gbit,10gbit",
        help="with --hosts: comma-separated link rates, as tc writes them (default 1gbit,10gbit)",
    )
    parser.add_argument("--delay", help="with --hosts: one-way delay each host adds, e.g. 1ms")
    # Used when the benchmark starts itself as a contender's process.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--timeline", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--compression", default="none", help=argparse.SUPPRESS)


def _at_least(least):
    """Return an argparse type that takes an integer of at least ``least``."""

    def parse(text):
        count = int(text)
        if count < least:
            raise argparse.ArgumentTypeError(f"expected {least} or more, got {count}")
        return count

    return parse


def run(args) -> int:
    """Run every contender on every model; print the table."""
    if args.backend != "tensorflow":
        from ringtrain.bench import train_backends

        return train_backends.work(args) if args.worker else train_backends.run(args)
    if args.worker:
        return _work(args)
    if args.hosts:
        from ringtrain.bench import train_cluster

        return train_cluster.run(args)
    rows = []
    for model in args.models.split(","):
        rounds = measure_rounds(args, model.strip(), _measure_round)
        rows.extend(summarize(model.strip(), rounds, args.batch))
    print_rows(rows, args.np, args.inter_op_threads, args.rounds)
    write_json(args, rows)
    return 0


def measure_rounds(args, model, measure) -> list:
    """Return ``measure(args, model)`` of each of ``args.rounds`` rounds, printing each's rates.

    Each round as it ends: a long run that fails later still shows what it measured.
    """
    rounds = []
    for k in range(1, args.rounds + 1):
        rounds.append(measure(args, model))
        rates = ", ".join(f"{name} {rate:.0f}" for name, rate in rounds[-1]["rates"].items())
        print(f"{model} round {k}/{args.rounds}, samples/s: {rates}", flush=True)
    return rounds


def write_json(args, rows) -> None:
    """Write ``rows`` as JSON to ``args.json``, where it names a file."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


# -- the orchestrating process ---------------------------------------------------------


def _measure_round(args, model):
    """Run every contender once; return their results."""
    n = args.np
    alone = launch([worker_command(args, "alone", model)], args.timeout)[0]
    independent = launch(at_once(args, "alone", model), args.timeout)
    rt_cmd = worker_command(args, "ringtrain", model)
    ringtrain = launch([_runner(n, rt_cmd)], args.timeout)[0]
    hidden = hidden_at(n, rt_cmd, args.timeout)
    packed = launch([_runner(n, worker_command(args, "packed", model))], args.timeout)[0]
    mwms = launch(at_once(args, "mwms", model), args.timeout, _mwms_env(n))[0]
    # Each contender: the processes that reported for it, and the figure it takes of them.
    reports = {
        "one process": ([alone], "samples_per_sec"),
        "one process, model.fit": ([alone], "fit_samples_per_sec"),
        f"{n} independent processes": (independent, "samples_per_sec"),
        f"ringtrain -np {n}": ([ringtrain], "samples_per_sec"),
        f"ringtrain -np {n}, model.fit": ([ringtrain], "fit_samples_per_sec"),
        f"{HOROVOD}, -np {n}": ([packed], "samples_per_sec"),
        f"MultiWorkerMirroredStrategy, {n} workers": ([mwms], "samples_per_sec"),
    }
    return {
        "rates": {name: sum(r[key] for r in found) for name, (found, key) in reports.items()},
        # What each contender's scaling ratio is taken against: the same kind of step.
        "baselines": {
            name: "one process, model.fit" if key == "fit_samples_per_sec" else "one process"
            for name, (_, key) in reports.items()
        },
        "hidden": hidden,
        # As every reporting process ran with it (0: TensorFlow's default).
        "threads": {r["inter_op_threads"] for r in (alone, *independent, ringtrain, packed, mwms)},
        "cpus": {name: {r["cpus"] for r in found} for name, (found, _) in reports.items()},
        # Per contender that runs the custom step, its first process's CPU per step by role.
        "cpu_ms": {
            name: found[0]["cpu_ms_per_step"]
            for name, (found, key) in reports.items()
            if key == "samples_per_sec" and found[0].get("cpu_ms_per_step")
        },
    }


def summarize(model, rounds, batch):
    """Return one row per contender: medians over ``rounds`` (``_measure_round``'s results).

    A contender's scaling ratio is against its baseline (one process running the same kind
    of step) and ``vs_mwms`` against the last contender; each ratio is taken within a round,
    then its median over the rounds.
    """
    names = list(rounds[0]["rates"])
    baselines = rounds[0]["baselines"]
    threads = sorted(set().union(*(r["threads"] for r in rounds)))
    rows = []
    for name in names:
        rates = [r["rates"][name] for r in rounds]
        hidden = [r["hidden"][name] for r in rounds if name in r["hidden"]]
        cpu = [r["cpu_ms"][name] for r in rounds if name in r["cpu_ms"]]
        rows.append(
            {
                "model": model,
                "contender": name,
                "samples_per_sec": float(np.median(rates)),
                "scaling_ratio": float(
                    np.median([r["rates"][name] / r["rates"][baselines[name]] for r in rounds])
                ),
                "vs_mwms": float(
                    np.median([r["rates"][name] / r["rates"][names[-1]] for r in rounds])
                ),
                "hidden_fraction": float(np.median(hidden)) if hidden else None,
                # Medians over the rounds, per role (``ringtrain.bench.thread_cpu``).
                "cpu_ms_per_step": (
                    {role: float(np.median([c[role] for c in cpu])) for role in thread_cpu.ROLES}
                    if cpu
                    else None
                ),
                "per_round_samples_per_sec": rates,
                "batch_per_rank": batch,
                "inter_op_threads": threads,
                # The CPUs each of its reporting processes could run on, over the rounds.
                "cpus_per_process": sorted(set().union(*(r["cpus"][name] for r in rounds))),
            }
        )
    return rows


def worker_command(args, worker, model):
    """Return the command of one process of contender ``worker`` on ``model``."""
    return [
        sys.executable, "-m", "ringtrain.bench", "train", "--worker", worker, "--model", model,
        "--batch", str(args.batch), "--np", str(args.np), "--steps", str(args.steps),
        "--warmup", str(args.warmup), "--inter-op-threads", str(args.inter_op_threads),
    ]  # fmt: skip


def _runner(n, command):
    return [sys.executable, "-m", "ringtrain.runner", "-np", str(n), *command]


def hidden_at(n, command, timeout, env=None) -> dict:
    """Return ringtrain's hidden fraction at -np ``n``, from a run of ``command`` with a timeline.

    As {contender: fraction}; empty at one rank, whose optimizer exchanges nothing.
    """
    if n == 1:
        return {}
    folder = tempfile.mkdtemp(prefix="ringtrain-bench-")
    try:
        timeline = os.path.join(folder, "timeline-{rank}.json")
        traced_command = _runner(n, [*command, "--timeline", timeline])
        traced = launch([traced_command], timeout, None if env is None else [env])[0]
    finally:
        shutil.rmtree(folder)
    return {f"ringtrain -np {n}": traced["hidden_fraction"]}


def at_once(args, worker, model):
    """Return the commands of ``args.np`` processes that run at once and share the cores."""
    command, n = worker_command(args, worker, model), args.np
    return [[*command, "--index", str(i), "--processes", str(n)] for i in range(n)]


def _mwms_env(n):
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
        for i in range(n)
    ]


def launch(commands, timeout, envs=None):
    """Start ``commands`` at once; return the result each printed (if it printed one)."""
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    # Every contender gets the CPU allocator that ringtrain.tensorflow asks for.
    tf_allocator.prefer_pooling(base)
    procs = [
        subprocess.Popen(
            command,
            env={**base, **(envs[i] if envs else {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, command in enumerate(commands)
    ]
    results = []
    deadline = time.monotonic() + timeout
    for proc, command in zip(procs, commands, strict=True):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"benchmark process timed out: {' '.join(command)}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark process failed: {' '.join(command)}\n{out}")
        results.extend(
            json.loads(line.split(_MARK, 1)[1]) for line in out.splitlines() if _MARK in line
        )
    return results


def print_rows(rows, n, inter_op, rounds):
    """Print the table of ``rows`` (``summarize``'s) and their CPU per step."""
    inter = f"{inter_op} inter-op" if inter_op else "TensorFlow's default inter-op threads"
    print(f"one intra-op thread and {inter} per rank; samples/sec over all ranks (np={n})")
    if rounds > 1:
        print(f"medians of {rounds} rounds; each ratio is taken within a round")
    print(f"{'model':<6} {'contender':<40} {'samples/s':>10} {'ratio':>6} {'vs MWMS':>8} hidden")
    for r in rows:
        hidden = "" if r["hidden_fraction"] is None else f"{r['hidden_fraction']:.0%}"
        print(
            f"{r['model']:<6} {r['contender']:<40} {r['samples_per_sec']:>10.0f} "
            f"{r['scaling_ratio']:>6.2f} {r['vs_mwms']:>8.2f} {hidden}"
        )
    timed = [r for r in rows if r["cpu_ms_per_step"]]
    if not timed:
        return
    print("CPU ms per step of a contender's first process, by thread (other: ringtrain's engine)")
    header = f"{'TensorFlow':>10} {'main':>6} {'other':>6} {'total':>6}"
    print(f"{'model':<6} {'contender':<40} {header}")
    for r in timed:
        cpu = r["cpu_ms_per_step"]
        print(
            f"{r['model']:<6} {r['contender']:<40} {cpu['tensorflow']:>10.2f} "
            f"{cpu['main']:>6.2f} {cpu['other']:>6.2f} {sum(cpu.values()):>6.2f}"
        )


# -- a contender's process -------------------------------------------------------------


def _work(args) -> int:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    import keras

    kind, n = args.worker, args.np
    index, processes = args.index, args.processes
    if kind == "packed":
        from mpi4py import MPI

        index, processes = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if kind != "ringtrain" and settings.read().bind_cores:
        # As ringtrain's ranks do at init(): processes that run at once share out the cores.
        affinity.pin_share(index, processes)
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if kind == "mwms" else None
    reporting = kind == "alone" or (kind == "mwms" and args.index == 0)
    if kind == "ringtrain":
        import ringtrain.tensorflow.keras as hvd

        hvd.init(timeline=args.timeline)
        n, reporting = hvd.size(), hvd.rank() == 0
    elif kind == "packed":
        n, reporting = processes, index == 0
    keras.utils.set_random_seed(0)
    replicas = n if kind in ("ringtrain", "mwms", "packed") else 1
    x, y, build = _model_and_data(args.model, args.batch * replicas)
    if strategy is None:
        model, optimizer = build(), keras.optimizers.SGD(0.01)
        if kind == "ringtrain":
            compression = getattr(hvd.Compression, args.compression)
            optimizer = hvd.DistributedOptimizer(optimizer, compression=compression)
        if kind == "packed":
            step = _packed_step(model, optimizer, x[: args.batch], y[: args.batch])
        else:
            step = _local_step(model, optimizer, x[: args.batch], y[: args.batch])
    else:
        with strategy.scope():
            model, optimizer = build(), keras.optimizers.SGD(0.01)
        step = _strategy_step(strategy, model, optimizer, x, y)
    seconds, cpu = _seconds_per_step(step, args)
    result = {
        "samples_per_sec": replicas * args.batch / seconds,
        "cpu_ms_per_step": {role: used / args.steps * 1000 for role, used in cpu.items()},
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "cpus": len(affinity.current() or ()),
        "gradient_bytes": gradient_bytes(model),
    }
    if kind == "ringtrain":
        result.update(_ringtrain_extras(args, build, x, y, n, hvd))
    elif kind == "alone" and args.processes == 1:
        optimizer = keras.optimizers.SGD(0.01)
        result["fit_samples_per_sec"] = _fit_samples_per_sec(args, build(), optimizer, x, y, 1)
    if reporting:
        print(_MARK + json.dumps(result), flush=True)
    return 0


def gradient_bytes(model) -> int:
    """Return the bytes of one replica's gradients a step: what an allreduce of them moves."""
    variables = model.trainable_variables
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def _ringtrain_extras(args, build, x, y, n, hvd):
    import keras

    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    extras = {"fit_samples_per_sec": _fit_samples_per_sec(args, build(), optimizer, x, y, n)}
    rank = hvd.rank()
    hvd.shutdown()  # closes the timeline
    if args.timeline:
        extras["hidden_fraction"] = hidden_fraction(args.timeline.format(rank=rank), args.warmup)
    return extras


def _fit_samples_per_sec(args, model, optimizer, x, y, replicas):
    """Return the samples/sec over ``replicas`` processes of ``model.fit``, timed per batch."""
    import keras
    import tensorflow as tf

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    times = []
    clock = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: times.append(time.perf_counter())
    )
    dataset = tf.data.Dataset.from_tensors((x[: args.batch], y[: args.batch])).repeat()
    model.fit(dataset, steps_per_epoch=args.warmup + args.steps, verbose=0, callbacks=[clock])
    return replicas * args.batch / float(np.mean(np.diff(times[args.warmup :])))


def _model_and_data(name, rows):
    import keras

    rng = np.random.default_rng(0)
    if name == "mlp":
        shape = (784,)

        def build():
            return keras.Sequential(
                [keras.Input(shape)]
                + [keras.layers.Dense(1024, activation="relu") for _ in range(3)]
                + [keras.layers.Dense(10)]
            )

    elif name == "cnn":
        shape = (28, 28, 1)

        def build():
            return keras.Sequential(
                [
                    keras.Input(shape),
                    keras.layers.Conv2D(32, 3, activation="relu"),
                    keras.layers.Conv2D(64, 3, activation="relu"),
                    keras.layers.MaxPooling2D(2),
                    keras.layers.Flatten(),
                    keras.layers.Dense(128, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )

    elif name in _APPLICATIONS:
        shape = (32, 32, 3)  # small images: per-tensor costs weigh as on a fast device

        def build():
            application = getattr(keras.applications, _APPLICATIONS[name])
            return application(
                weights=None, input_shape=shape, classes=10, classifier_activation=None
            )

    else:
        raise ValueError(f"unknown model {name!r}; expected mlp, cnn, {', '.join(_APPLICATIONS)}")
    x = rng.random((rows, *shape), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype(np.int32)
    return x, y, build


def _local_step(model, optimizer, x, y):
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    return step


def _packed_step(model, optimizer, x, y):
    """Return a step that reduces its gradients as Horovod 0.28 does on CPU.

    The step's gradients are packed into one buffer, averaged by one ``MPI_Allreduce``
    once backprop has ended, and unpacked: no overlap with backprop.
    """
    import keras
    import tensorflow as tf
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = tf.constant(x), tf.constant(y)
    variables = model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in variables]

    @tf.function
    def packed_gradients():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tf.concat([tf.reshape(g, [-1]) for g in tape.gradient(loss, variables)], 0)

    @tf.function
    def apply(packed):
        parts = tf.split(packed, sizes)
        shaped = [tf.reshape(p, v.shape) for p, v in zip(parts, variables, strict=True)]
        optimizer.apply(shaped, variables)

    def step():
        packed = packed_gradients().numpy()
        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)
        packed /= comm.Get_size()
        apply(packed)

    return step


def _strategy_step(strategy, model, optimizer, x, y):
    import keras
    import tensorflow as tf

    global_batch = len(x)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    batches = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            per_sample = loss_fn(yb, model(xb, training=True))
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    @tf.function
    def step():
        strategy.run(replica_step, args=next(batches))

    return step


def _seconds_per_step(step, args):
    """Return the seconds a step takes, and the CPU seconds each thread role used in all."""
    for _ in range(args.warmup):
        step()
    before = thread_cpu.cpu_seconds()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    elapsed = time.perf_counter() - started
    return elapsed / args.steps, thread_cpu.by_role(before, thread_cpu.cpu_seconds())


def hidden_fraction(path, skip_steps=0):
    """Return 1 - exposed / total communication time of the optimizer's steps in a timeline.

    Per step: every fused reduction's engine work (MEMCPY_IN start to MEMCPY_OUT end) is
    communication; what of it lies after the step's last ENQUEUE is exposed.
    """
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    tracks = {}
    for e in events:
        name = names.get(e.get("tid"))
        if e.get("ph") in ("X", "i") and name and name.startswith(_SITE):
            tracks.setdefault(name, {}).setdefault(e["name"], []).append(e)
    steps = min(len(t.get("MEMCPY_OUT_FUSION_BUFFER", [])) for t in tracks.values())
    total = exposed = 0.0
    for k in range(skip_steps, steps):
        last_enqueue = max(t["ENQUEUE"][k]["ts"] for t in tracks.values())
        spans = {
            (t["MEMCPY_IN_FUSION_BUFFER"][k]["ts"], _end(t["MEMCPY_OUT_FUSION_BUFFER"][k]))
            for t in tracks.values()
        }
        total += _union(spans)
        exposed += _union({(max(a, last_enqueue), b) for a, b in spans if b > last_enqueue})
    return 1.0 - exposed / total if total else 0.0


def _end(event):
    return event["ts"] + event["dur"]


def _union(spans):
    covered, reach = 0.0, -np.inf
    for start, end in sorted(spans):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered
