"""The framework-neutral hand-over's plan, with no engine: buckets, names, what errors say."""

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
