"""The framework-neutral hand-over's plan with no engine, and the portable optimizer's refusals."""

import os
import subprocess
import sys

import pytest

from ringtrain import exchange


@pytest.mark.parametrize(
    ("sizes", "cap", "want"),
    [
        ([], 1024, []),
        ([8], 1024, [[0]]),
        ([0], 1024, [[0]]),
        # The benchmark's MLP, last layer first: bias, kernel, bias, kernel, ...: every
        # kernel of 64 KiB or more goes alone, the small ones before it share a run.
        (
            [40, 40960, 4096, 4194304, 4096, 4194304, 4096, 3211264],
            2**16,
            [[0, 1, 2], [3], [4], [5], [6], [7]],
        ),
        ([100, 924, 1, 1023, 1024, 5], 1024, [[0, 1], [2, 3], [4], [5]]),
        ([100, 900, 30, 1, 2000, 3], 1024, [[0, 1, 2], [3], [4], [5]]),
        ([100, None, 100, 100], 1024, [[0], [1], [2, 3]]),
        ([100, 0, 7], 0, [[0], [1], [2]]),
    ],
)
def test_buckets_share_small_sizes_and_leave_large_or_unknown_ones_alone(sizes, cap, want):
    assert exchange.buckets(sizes, cap) == want


def test_a_handover_names_its_parts_and_sends_the_manifest_with_the_first_bucket():
    submitted = []

    def start(name):
        return lambda array: submitted.append((name, array)) or name

    kinds = [exchange.DENSE, exchange.NO_TENSOR, exchange.SPARSE]
    parts = [
        exchange.Part(2, ".values", start, 8, False),
        exchange.Part(2, ".indices", start, 8, False),
        exchange.Part(0, "", start, 1 << 20, True),
    ]
    plan = exchange.Handover("site", kinds, ["a", "b", "c"], parts, 1024)
    assert plan.buckets == [[0, 1], [2]]
    assert plan.describes == [
        "site: ranks hand over different numbers of tensors (this rank: 3)",
        "site: c",
        "site: c",
        "site: a",
    ]
    assert plan.submit(1, ["big"]) == ["site.0"]
    assert submitted == [("site.0", "big")]
    assert plan.codes.tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 1]]


@pytest.mark.parametrize(
    ("dtypes", "settings", "grouped"),
    [
        (["float32"] * 3, [1.0] * 3, True),
        (["float32", "float64", "float32"], [1.0] * 3, False),  # one request, one dtype
        (["float32", None, "float32"], [1.0] * 3, False),  # a dtype the plan does not know
        (["float32"] * 3, [1.0, 0.5, 1.0], False),  # other scale factors
    ],
)
def test_a_bucket_of_allreduces_alike_is_one_grouped_request(dtypes, settings, grouped):
    parts = [
        exchange.Part(i, "", exchange.reducer(exchange.Average, prescale=f), 8, True, dtype)
        for i, (dtype, f) in enumerate(zip(dtypes, settings, strict=True))
    ]
    plan = exchange.Handover("site", [exchange.DENSE] * 3, list("abc"), parts, 1024)
    assert plan.buckets == [[0, 1, 2]]
    assert plan.handle_count(0) == (2 if grouped else 4)  # the manifest's handle, and theirs


def test_a_grouped_bucket_is_named_for_its_first_part_and_described_by_its_entries():
    start = exchange.reducer(exchange.Sum)
    parts = [exchange.Part(i, "", start, 8, True, "float32") for i in (2, 1)]
    plan = exchange.Handover("site", [exchange.DENSE] * 3, list("abc"), parts, 1024)
    assert plan._groups[0][1] == "site: c, b"
    assert plan._groups[0][0].keywords["name"] == "site.2.bucket2"


def test_the_portable_optimizer_refuses_or_warns_about_what_it_does_not_do():
    pytest.importorskip("torch")
    script = """
import warnings, keras
import ringtrain.keras as hvd
sgd = keras.optimizers.SGD
for bad, error in (({"backward_passes_per_step": 2}, ValueError), ({"nonsense": 1}, TypeError)):
    try:
        hvd.DistributedOptimizer(sgd(), **bad)
    except error as err:
        print("refused:", err)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hvd.DistributedOptimizer(sgd(), compression=hvd.Compression.fp16)
print("warned:", [str(w.message) for w in caught if "ringtrain" in str(w.message)])
wrapped = hvd.DistributedOptimizer(sgd(), gradient_predivide_factor=2.0)
print("config:", wrapped.get_config()["ringtrain"])
"""
    env = dict(os.environ, KERAS_BACKEND="torch")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "refused: backward_passes_per_step=2: only 1 is supported on the torch backend" in out
    assert "refused: DistributedOptimizer() got unexpected arguments ['nonsense']" in out
    assert "compression 'fp16' is not applied on the torch backend" in out, out
    assert "'gradient_predivide_factor': 2.0" in out and "'hand_over_in_backprop': True" in out
