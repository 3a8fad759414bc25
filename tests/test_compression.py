"""16-bit values on the wire: the strategies, and the ring under a real mpirun at 1 to 4 ranks."""

import pytest
from mpi_launch import check

import ringtrain
from ringtrain import compression


def test_strategies_by_name_and_their_wire_dtypes():
    assert ringtrain.Compression is compression.Compression
    for name, wire in (("none", None), ("fp16", "float16"), ("bf16", "bfloat16")):
        strategy = compression.by_name(name)
        assert strategy is getattr(compression.Compression, name)
        assert strategy.name == name and compression.wire_dtype(strategy) == wire
        tensor = object()
        assert strategy.compress(tensor) == (tensor, None)
        assert strategy.decompress(tensor, None) is tensor
    with pytest.raises(ValueError, match="unknown compression 'zip'; expected one of 'none'"):
        compression.by_name("zip")


def test_a_users_own_strategy_sends_what_it_compressed():
    class Halve:
        @staticmethod
        def compress(tensor):
            return tensor, None

    class Odd:
        wire_dtype = "float8"

    assert compression.wire_dtype(Halve) is None
    assert compression.wire_dtype(None) is None
    with pytest.raises(ValueError, match="wire_dtype 'float8'; expected None or one of float16"):
        compression.wire_dtype(Odd)


@pytest.mark.mpi
@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_compressed_allreduce_matches_the_simulated_16_bit_ring_bit_for_bit(np):
    # 256-byte chunks: 128 16-bit values each, so tensors cross in many chunks.
    env = {"RINGTRAIN_RING_CHUNK_BYTES": "256"}
    check("check_wire16.py", np, env=env, timeout=420)


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3, 4])
def test_the_hierarchical_ring_across_hosts_sends_16_bit_values(np):
    check("check_wire16_hosts.py", np, timeout=240)
