"""The TensorFlow binding's pure parts, in one process without MPI: configs, names, dtypes."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ringtrain import compression as core_compression  # noqa: E402
from ringtrain import tf_allocator  # noqa: E402
from ringtrain.keras.optimizer import is_distributed, stock_optimizer_classes  # noqa: E402
from ringtrain.ops import Sum  # noqa: E402
from ringtrain.tensorflow import compat, compression, exchange  # noqa: E402
from ringtrain.tensorflow.keras import optimizer as distributed  # noqa: E402


def test_compression_strategies_cast_as_horovod_and_leave_reductions_to_the_wire():
    none = compression.Compression.none
    assert none is core_compression.Compression.none
    x = tf.constant([1.5, -2.25, 1e-3], tf.float32)
    assert none.compress(x) == (x, None) and none.decompress(x, None) is x
    for strategy, wire in (
        (compression.Compression.fp16, tf.float16),
        (compression.Compression.bf16, tf.bfloat16),
    ):
        assert strategy.wire_dtype == core_compression.by_name(strategy.name).wire_dtype
        compressed, ctx = strategy.compress(x)
        assert compressed.dtype == wire and strategy.decompress(compressed, ctx).dtype == x.dtype
        assert compression.by_name(strategy.name) is strategy
        assert compression.for_engine(strategy) is strategy
        assert compression.around_reduction(strategy) is none
    assert compression.for_engine(none) is None

    class OwnCast:  # Horovod-style, with no wire_dtype: it works in TensorFlow, as before
        @staticmethod
        def compress(tensor):
            return tf.cast(tensor, tf.float16), tensor.dtype

    assert compression.for_engine(OwnCast) is None
    assert compression.around_reduction(OwnCast) is OwnCast
    with pytest.raises(ValueError, match="unknown compression"):
        compression.by_name("zip")


def test_a_compressed_distributed_optimizer_round_trips_its_config():
    for name in ("fp16", "bf16"):
        strategy = compression.by_name(name)
        wrapped = distributed.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=strategy)
        config = wrapped.get_config()
        assert config["ringtrain"]["compression"] == name
        again = type(wrapped).from_config(copy.deepcopy(config))
        assert again._rt_reduction.compression is strategy


def test_gradient_reduction_validates_its_settings():
    with pytest.raises(ValueError, match="op=Average"):
        exchange.GradientReduction(op=Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="> 0"):
        exchange.GradientReduction(gradient_predivide_factor=0.0)
    with pytest.raises(ValueError, match="unknown reduction op"):
        exchange.GradientReduction(op=42)


@pytest.mark.parametrize("dtype", [tf.bool, tf.uint32, tf.int16, tf.complex64, tf.float32])
def test_engine_wire_carries_any_fixed_size_dtype(dtype):
    value = tf.cast(tf.constant([[0, 1, 3], [2, 0, 1]]), dtype)
    wire, restore = exchange.engine_wire(value)
    assert np.dtype(wire.dtype.as_numpy_dtype) in exchange._ENGINE_DTYPES
    assert restore(wire).dtype == dtype
    assert np.array_equal(restore(wire).numpy(), value.numpy())


def test_site_names_are_per_step_graph_and_restart_on_retrace():
    assert compat.site_name("S") == "S" and compat.site_name("S") == "S"  # eagerly
    seen = []

    @tf.function
    def step(x):
        seen.append(compat.site_name("S"))
        tf.cond(x > 0, lambda: seen.append(compat.site_name("S")) or x, lambda: x)
        return x

    step(tf.constant(1.0))
    step(tf.constant(2.0))  # no retrace
    step(tf.constant(1, tf.int32))  # a retrace starts again from the first name
    assert len(seen) == 4, seen
    assert seen[:2] == ["S", "S.1"], seen
    assert seen[-2:] == ["S", "S.1"], seen


@pytest.mark.parametrize("base", stock_optimizer_classes(), ids=lambda c: c.__name__)
def test_every_keras_optimizer_wraps_and_round_trips(base):
    if base is keras.optimizers.LossScaleOptimizer:
        original = base(keras.optimizers.SGD(0.1))
    else:
        try:
            original = base()
        except TypeError:
            pytest.skip(f"{base.__name__} needs constructor arguments")
    wrapped = distributed.DistributedOptimizer(
        original, backward_passes_per_step=3, op=Sum, average_aggregated_gradients=True
    )
    assert isinstance(wrapped, base) and is_distributed(wrapped)
    config = wrapped.get_config()
    assert config["ringtrain"]["backward_passes_per_step"] == 3
    assert config["ringtrain"]["average_aggregated_gradients"] is True
    assert config["ringtrain"]["op"] == "Sum"
    again = type(wrapped).from_config(copy.deepcopy(config))  # LossScaleOptimizer pops keys
    assert again.get_config() == config
    name = keras.saving.get_registered_name(type(wrapped))
    assert keras.saving.get_registered_object(name) is type(wrapped)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(wrapped))
    assert type(restored) is type(wrapped) and restored.get_config() == config


@keras.saving.register_keras_serializable("ringtrain_tests")
class Own(keras.optimizers.SGD):
    """An optimizer class of the user's own (its update might slice the gradients)."""


def test_only_keras_own_updates_get_shared_results():
    def shared(optimizer):
        return distributed.DistributedOptimizer(optimizer)._rt_reduction.shared_results

    assert shared(keras.optimizers.Adam())
    assert shared(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
    assert not shared(Own())
    assert not shared(keras.optimizers.LossScaleOptimizer(Own()))


def test_distributed_optimizer_rejects_bad_input():
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        distributed.DistributedOptimizer("adam")
    wrapped = distributed.DistributedOptimizer(keras.optimizers.Adam())
    with pytest.raises(ValueError, match="already"):
        distributed.DistributedOptimizer(wrapped)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        distributed.DistributedOptimizer(keras.optimizers.Adam(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="average_aggregated_gradients must be True or False"):
        distributed.DistributedOptimizer(keras.optimizers.Adam(), average_aggregated_gradients=2)


def test_hidden_fraction_counts_communication_after_the_last_enqueue(tmp_path):
    from ringtrain.bench.train import hidden_fraction

    def track(tid, name):
        return {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}}

    def span(tid, phase, ts, dur):
        return {"name": phase, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    def enqueue(tid, ts):
        return {"name": "ENQUEUE", "ph": "i", "s": "t", "ts": ts, "pid": 0, "tid": tid}

    events = [track(1, "DistributedOptimizer.1"), track(2, "DistributedOptimizer.0")]
    events += [track(3, "DistributedGradientTape.0"), enqueue(3, 500.0)]  # not counted
    for step in range(2):
        t = 1000.0 * step
        # Gradient 1 arrives at t and is reduced over [t+10, t+30); gradient 0 arrives at
        # t+20 (the last ENQUEUE) and is reduced over [t+30, t+40): 20 of 30 exposed.
        events += [enqueue(1, t), enqueue(2, t + 20)]
        events += [span(1, "MEMCPY_IN_FUSION_BUFFER", t + 10, 5)]
        events += [span(1, "MEMCPY_OUT_FUSION_BUFFER", t + 25, 5)]
        events += [span(2, "MEMCPY_IN_FUSION_BUFFER", t + 30, 2)]
        events += [span(2, "MEMCPY_OUT_FUSION_BUFFER", t + 38, 2)]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events))
    assert hidden_fraction(str(path)) == pytest.approx(1 - 40 / 60)
    assert hidden_fraction(str(path), skip_steps=1) == pytest.approx(1 - 20 / 30)


def test_the_benchmark_models_gradients_weigh_what_their_layers_hold():
    from ringtrain.bench.train import _model_and_data, gradient_bytes

    # 784-1024x3-10, weights and biases, float32.
    mlp = 784 * 1024 + 2 * 1024 * 1024 + 1024 * 10 + 3 * 1024 + 10
    # Two 3x3 convolutions (1 -> 32 -> 64 channels), 12 x 12 x 64 pooled into 128, then 10.
    cnn = 9 * 32 + 32 + 9 * 32 * 64 + 64 + 12 * 12 * 64 * 128 + 128 + 128 * 10 + 10
    for name, params in (("mlp", mlp), ("cnn", cnn)):
        build = _model_and_data(name, 1)[2]
        assert gradient_bytes(build()) == 4 * params, name


def test_the_training_table_gives_medians_and_ratios_taken_within_each_round():
    from ringtrain.bench.train import summarize

    def round_of(alone, ring, mwms, hidden, threads=1):
        # model.fit runs at 80% of each custom step's speed: its ratio, against one
        # process's model.fit, is the custom step's.
        fits = {"one process, fit": alone * 0.8, "ringtrain -np 2, fit": ring * 0.8}
        rates = {"one process": alone, **fits, "ringtrain -np 2": ring, "MWMS": mwms}
        cpus = {name: {2 if name.startswith("one") else 1} for name in rates}
        baselines = {name: "one process" for name in rates}
        baselines["ringtrain -np 2, fit"] = "one process, fit"
        baselines["one process, fit"] = "one process, fit"
        # CPU ms per step by role; MWMS reported none (as where /proc is missing).
        cpu_ms = {
            "one process": {"tensorflow": 9.0, "main": 0.5, "other": 0.0},
            "ringtrain -np 2": {"tensorflow": 10.0 + hidden, "main": 0.5, "other": hidden * 5},
        }
        return {
            "rates": rates,
            "baselines": baselines,
            "hidden": {"ringtrain -np 2": hidden},
            "threads": {threads},
            "cpus": cpus,
            "cpu_ms": cpu_ms,
        }

    # The machine's speed differs from round to round. Ratios within a round are 1.3, 2.0 and
    # 1.2 against one process (median 1.3; the medians of the rates would give 1800 / 1500 =
    # 1.2), and 2.6, 4.0 and 4.0 against MWMS (median 4.0; 1800 / 500 = 3.6).
    rounds = [
        round_of(1000, 1300, 500, 0.4),
        round_of(2000, 4000, 1000, 0.6, threads=0),
        round_of(1500, 1800, 450, 0.5),
    ]
    rows = summarize("mlp", rounds, 64)
    fits = ["one process, fit", "ringtrain -np 2, fit"]
    assert [r["contender"] for r in rows] == ["one process", *fits, "ringtrain -np 2", "MWMS"]
    assert [r["scaling_ratio"] for r in rows[1:3]] == pytest.approx([1.0, 1.3])
    assert rows[2]["samples_per_sec"] == pytest.approx(1800 * 0.8)
    del rows[1:3]
    ring = rows[1]
    assert ring["samples_per_sec"] == 1800
    assert ring["per_round_samples_per_sec"] == [1300, 4000, 1800]
    assert ring["scaling_ratio"] == pytest.approx(1.3)
    assert ring["vs_mwms"] == pytest.approx(4.0)
    assert ring["hidden_fraction"] == pytest.approx(0.5)
    assert rows[0]["scaling_ratio"] == 1.0 and rows[0]["hidden_fraction"] is None
    assert rows[2]["vs_mwms"] == 1.0
    assert all(r["inter_op_threads"] == [0, 1] and r["batch_per_rank"] == 64 for r in rows)
    assert [r["cpus_per_process"] for r in rows] == [[2], [1], [1]]
    assert rows[0]["cpu_ms_per_step"] == {"tensorflow": 9.0, "main": 0.5, "other": 0.0}
    assert ring["cpu_ms_per_step"] == pytest.approx({"tensorflow": 10.5, "main": 0.5, "other": 2.5})
    assert rows[2]["cpu_ms_per_step"] is None


@pytest.mark.parametrize(("bucket_bytes", "enqueues"), [("0", 4), ("1048576", 1)])
def test_a_gradient_exchange_waits_in_one_op_after_one_enqueue_per_bucket(
    monkeypatch, bucket_bytes, enqueues
):
    monkeypatch.setenv("RINGTRAIN_BUCKET_BYTES", bucket_bytes)  # read at trace time
    grads = [
        tf.ones([3, 2]),
        None,
        tf.IndexedSlices(tf.ones([2, 4]), tf.constant([0, 5]), tf.constant([6, 4])),
        tf.ones([7]),
    ]

    @tf.function
    def exchanged():
        return exchange.allreduce_gradients(grads, ["a", "b", "c", "d"], "site", op=Sum)

    ops = exchanged.get_concrete_function().graph.get_operations()
    names = [op.name.rsplit("/", 1)[-1] for op in ops if op.type in ("PyFunc", "EagerPyFunc")]
    # Three dense or sparse entries make four parts (values and indices): one op each, the
    # first with the manifest; or all of them with the manifest in one op, for they are
    # small and of known sizes.
    assert sorted(name.split("_")[1] for name in names) == ["enqueue"] * enqueues + ["synchronize"]


def test_importing_the_binding_asks_for_the_pooling_allocator_unless_told_otherwise():
    code = "import os, ringtrain.tensorflow; print(os.environ['TF_CPU_ALLOCATOR_USE_BFC'])"
    for given, expected in ((None, "true"), ("false", "false")):
        env = {k: v for k, v in os.environ.items() if k != tf_allocator.VARIABLE}
        if given is not None:
            env[tf_allocator.VARIABLE] = given
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-1] == expected


@pytest.mark.parametrize(("model", "gradients"), [("resnet50", 214), ("mobilenetv2", 158)])
def test_the_training_benchmarks_application_models_hand_over_many_gradients(model, gradients):
    from ringtrain.bench import train

    x, y, build = train._model_and_data(model, 3)
    built = build()
    assert x.shape == (3, 32, 32, 3) and y.shape == (3,)
    assert len(built.trainable_variables) == gradients
    assert tuple(built(x[:1]).shape) == (1, 10)
    with pytest.raises(ValueError, match="unknown model 'vgg'; expected mlp, cnn, resnet50"):
        train._model_and_data("vgg", 3)


def test_the_hand_over_goes_through_dlpack_by_default_only_where_tensorflow_sees_a_gpu(
    monkeypatch,
):
    from ringtrain.tensorflow import bridge

    sees = bool(tf.config.list_physical_devices("GPU"))
    monkeypatch.delenv("RINGTRAIN_TF_DLPACK", raising=False)
    assert bridge.through_dlpack() is sees  # before init(): the environment's settings
    for value, want in (("1", True), ("off", False)):
        monkeypatch.setenv("RINGTRAIN_TF_DLPACK", value)
        assert bridge.through_dlpack() is want, value
