"""Overlap: during model.fit, ring reductions start before backprop has produced every gradient.

Run with RINGTRAIN_TIMELINE=<dir>/timeline-{rank}.json; each rank reads its own timeline back.
"""

import json
import os

import numpy as np
from common import main
from tfsetup import configure

ARGS = configure()

import keras  # noqa: E402

import ringtrain.tensorflow.keras as hvd  # noqa: E402

LAYERS, WIDTH, BATCH, STEPS = 10, 512, 256, 8


def read_timeline(path):
    """Return {tensor name: {phase: [start times, in order]}} from a Chrome trace."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    tracks = {}
    for e in events:
        if e.get("ph") in ("X", "i"):
            tracks.setdefault(names[e["tid"]], {}).setdefault(e["name"], []).append(e["ts"])
    return tracks


def steps_of(tracks, phase, count):
    """Return, per step, the times of ``phase`` for every request of the optimizer's gradients.

    A request is one gradient, or a bucket of ``n`` small ones (named ``....bucket{n}``).
    """
    grads = [n for n in tracks if n.startswith("DistributedOptimizer.") and "manifest" not in n]
    covered = sum(int(n.rpartition(".bucket")[2]) if ".bucket" in n else 1 for n in grads)
    assert covered == 2 * LAYERS, f"expected {2 * LAYERS} gradients, got {sorted(grads)}"
    for name in grads:
        assert len(tracks[name].get(phase, [])) == count, (name, phase, tracks[name])
    return [[tracks[name][phase][k] for name in grads] for k in range(count)]


def body():
    hvd.init()
    r = hvd.rank()
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(WIDTH, activation="relu") for _ in range(LAYERS - 1)]
    model = keras.Sequential([keras.Input((WIDTH,)), *layers, keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    rng = np.random.default_rng(r)
    x = rng.normal(size=(STEPS * BATCH, WIDTH)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 10)).astype(np.float32)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    hvd.shutdown()  # closes the timeline

    tracks = read_timeline(os.environ["RINGTRAIN_TIMELINE"].format(rank=r))
    enqueued = steps_of(tracks, "ENQUEUE", STEPS)
    reduced = steps_of(tracks, "REDUCE_SCATTER", STEPS)
    overlapped = [min(rs) < max(enq) for enq, rs in zip(enqueued, reduced, strict=True)]
    fused = [len(set(rs)) < len(rs) for rs in reduced]
    print(f"rank {r}: overlapped steps {overlapped}, fused steps {fused}", flush=True)
    # The first step includes tracing and warm-up; a loaded machine may stall any one step.
    assert sum(overlapped[1:]) >= (STEPS - 1) // 2, f"rank {r}: too little overlap {overlapped}"
    assert any(fused), f"rank {r}: the engine never fused two gradients"


main(body)
