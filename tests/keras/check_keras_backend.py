"""One training step through ``ringtrain.keras`` on the backend ``KERAS_BACKEND`` names.

Each rank fits its own batch for one step with ``DistributedOptimizer`` (SGD, then Adam)
and ``BroadcastGlobalVariablesCallback``: its weights must equal, within float32 rounding,
those of one model trained in this process for one step on every rank's batch together,
from root rank 0's initial weights. The metrics that ``MetricAverageCallback`` averages must
equal NumPy's mean of every rank's own, ``LearningRateWarmupCallback`` must set the rate
that each batch's step sees, and ranks that hand over different gradients fail at once
with an error that names the variable. A job of one rank hands no gradient over at all, as
Horovod's optimizers do; a larger one hands over every one (the timeline shows which).
"""

import json
import os
import sys
import tempfile

import keras
import numpy as np

import ringtrain.keras as hvd

BATCH = 5  # per rank: uneven against the model's sizes
FEATURES = 7


def model_for(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(6, activation="tanh"),
            keras.layers.Dense(1, use_bias=False),
            keras.layers.Dense(3),
        ]
    )


def batch_of(rank):
    rng = np.random.default_rng(rank + 100)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.normal(size=(BATCH, 3)).astype(np.float32)
    return x, y


def one_step(optimizer_class, rank, size):
    model = model_for(seed=rank)  # every rank its own initial weights: the callback fixes that
    model.compile(
        optimizer=hvd.DistributedOptimizer(optimizer_class(learning_rate=0.1)), loss="mse"
    )
    x, y = batch_of(rank)
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
        ],
    )
    reference = model_for(seed=0)
    reference.compile(optimizer=optimizer_class(learning_rate=0.1), loss="mse")
    xs, ys = zip(*(batch_of(q) for q in range(size)), strict=True)
    reference.fit(
        np.concatenate(xs),
        np.concatenate(ys),
        batch_size=BATCH * size,
        epochs=1,
        verbose=0,
        shuffle=False,
    )
    for mine, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        assert np.allclose(mine, want, rtol=1e-5, atol=1e-6), (optimizer_class, rank, mine - want)
    # Each rank's loss was its own batch's before the step; the callback averages them.
    losses = []
    start = model_for(seed=0)
    for q in range(size):
        xq, yq = batch_of(q)
        losses.append(np.mean((start.predict(xq, verbose=0) - yq) ** 2))
    assert np.isclose(history.history["loss"][0], np.mean(losses), rtol=1e-5), history.history


def hands_over_only_beside_other_ranks(rank, size):
    """Check that the optimizer hands gradients over at 2 ranks or more, never at 1 (Horovod)."""
    model = model_for(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timeline-{rank}.json")
        hvd.start_timeline(path)
        model.fit(*batch_of(rank), batch_size=BATCH, epochs=1, verbose=0)
        hvd.stop_timeline()
        with open(path.format(rank=rank)) as file:
            tracks = [e["args"]["name"] for e in json.load(file) if e["ph"] == "M"]
    handed = [t for t in tracks if t.startswith("DistributedOptimizer")]
    if size > 1:  # every gradient, alone or in a bucket of n (``....bucket{n}``), and the manifest
        grads = [t for t in handed if not t.endswith(".manifest")]
        covered = sum(int(t.rpartition(".bucket")[2]) if ".bucket" in t else 1 for t in grads)
        assert covered == len(model.trainable_variables) and len(grads) < len(handed), tracks
    else:
        assert not handed, tracks


def warmup_sets_the_rate_each_batch(rank, size):
    """``LearningRateWarmupCallback`` ramps the rate batch by batch; the step sees it."""
    model = model_for(seed=0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = batch_of(rank)
    record = RateSeen()
    warmup = hvd.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2, steps_per_epoch=5)
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, shuffle=False, callbacks=[warmup, record])
    want = [0.4 * (b / 5 * (size - 1) / 2 + 1) / size for b in range(5)]
    assert np.allclose(record.seen, want, rtol=1e-6), (record.seen, want)


class RateSeen(keras.callbacks.Callback):
    """Records the learning rate after each batch (through ``self.model``, which syncs JAX)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        """Record the rate that this batch's step used."""
        rate = self.model.optimizer.learning_rate
        self.seen.append(float(keras.ops.convert_to_numpy(rate)))


def disagreeing_gradients(rank, size):
    model = model_for(seed=0)
    model.build((None, FEATURES))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    variables = model.trainable_variables
    grads = [np.ones(v.shape, np.float32) for v in variables]
    if rank == 1:
        grads[1] = None
    optimizer.build(variables)
    try:
        optimizer.apply(
            [None if g is None else keras.ops.convert_to_tensor(g) for g in grads], variables
        )
    except Exception as err:  # noqa: BLE001 - on JAX, XLA's error around ringtrain's
        text = str(err)
        assert "ranks disagree on its gradient" in text and variables[1].path in text, text
    else:
        raise AssertionError("ranks that hand over different gradients did not fail")


def a_second_backward_before_apply_is_refused(rank):
    """PyTorch's hooks hand each gradient over in backprop: accumulating again is an error."""
    import torch

    model = model_for(seed=0)
    model.build((None, FEATURES))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    variables = model.trainable_variables
    optimizer.build(variables)
    x, y = (torch.from_numpy(a) for a in batch_of(rank))
    torch.mean((model(x) - y) ** 2).backward()
    try:
        torch.mean((model(x) - y) ** 2).backward()
    except RuntimeError as err:
        assert "was accumulated again before the optimizer applied it" in str(err), err
    else:
        raise AssertionError("a second backward() before apply was not refused")
    optimizer.apply([v.value.grad for v in variables], variables)  # takes the first's back


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert keras.backend.backend() == os.environ["KERAS_BACKEND"], keras.backend.backend()
    for optimizer_class in (keras.optimizers.SGD, keras.optimizers.Adam):
        one_step(optimizer_class, rank, size)
    warmup_sets_the_rate_each_batch(rank, size)
    hands_over_only_beside_other_ranks(rank, size)
    if size > 1:  # one rank hands nothing over: its gradients accumulate as PyTorch's do
        disagreeing_gradients(rank, size)
        if keras.backend.backend() == "torch":
            a_second_backward_before_apply_is_refused(rank)
    if keras.backend.backend() != "tensorflow":
        # (keras.utils.set_random_seed imports TensorFlow where it is installed.)
        assert "ringtrain.tensorflow" not in sys.modules, "ringtrain imported its TF binding"
    print(f"rank {rank}: keras on {keras.backend.backend()} ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
