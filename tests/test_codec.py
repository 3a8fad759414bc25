"""Wire codecs: one hop's narrow, reduce and widen on the CPU kernels, against NumPy."""

import ml_dtypes
import numpy as np
import pytest

from ringtrain import compression, kernels
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.transport import codec

_CPU = kernels.backend_for(np.empty(0))
_WIRES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def test_every_wire_type_a_strategy_may_name_has_a_codec():
    assert set(compression.WIRE_DTYPES) == set(_WIRES)
    for name in compression.WIRE_DTYPES:
        found = codec.by_name(name)
        assert found.name == name and found.dtype == np.dtype(_WIRES[name])
    assert codec.by_name(None) is None
    with pytest.raises(ValueError, match="no wire codec 'int8'; expected one of 'float16'"):
        codec.by_name("int8")


@pytest.mark.parametrize("name", list(_WIRES))
def test_a_codec_counts_its_bytes_and_chunks_in_wire_values(name):
    wire = codec.by_name(name)
    assert wire.wire_bytes(0) == 0 and wire.wire_bytes(1001) == 2002
    assert wire.chunk_elements(1 << 20) == 1 << 19
    assert wire.chunk_elements(1) == 1  # one value at least


@pytest.mark.parametrize("name", list(_WIRES))
@pytest.mark.parametrize("length", [0, 1, 7, 1000])
def test_a_hop_narrows_adds_in_float32_rounds_and_widens_exactly(name, length):
    wire_type = np.dtype(_WIRES[name])
    rng = np.random.default_rng(length)
    src = rng.standard_normal(length).astype(np.float32)
    dst = np.full(length, np.nan, np.float32)
    side = codec.by_name(name).open(BufferPool(), _CPU, src, dst)
    lo, hi = length // 3, length
    sent = side.narrow(lo, hi)
    assert sent.dtype == np.uint16 and len(sent) == hi - lo
    np.testing.assert_array_equal(sent.view(wire_type), src[lo:hi].astype(wire_type))
    received = rng.standard_normal(hi - lo).astype(wire_type)
    side.reduce(lo, hi, received.view(np.uint16), ReduceOp.Sum, 0.5, finished=True)
    want = ((src[lo:hi] + received.astype(np.float32)) * np.float32(0.5)).astype(wire_type)
    np.testing.assert_array_equal(side.bits[lo:hi].view(wire_type), want)
    np.testing.assert_array_equal(dst[lo:hi], want.astype(np.float32))  # widened exactly
    assert np.isnan(dst[:lo]).all()  # outside the hop, nothing is written
