"""Wire codecs: how an allreduce's partial sums cross a link in fewer bytes than they are added.

A ``WireCodec`` is what a compression strategy's ``wire_dtype`` names. The ring asks it for
the bytes a call puts on the wire and the elements of a chunk, and opens one ``WireBuffer``
per call, which does a hop's three steps through the kernels:

- ``narrow``: this rank's values, rounded to the wire type, to send;
- ``reduce``: a received partial sum added to this rank's values and rounded again;
- ``widen``: wire values written back, exactly, into the float32 result.

Every rank ends with the bits the allgather hands round, so results are bitwise identical.
A new compression is a codec here and its kernels in ``ringtrain.kernels``.
"""

import numpy as np

from ringtrain import compression, dtypes

_CARRIER = np.dtype(np.uint16)  # what MPI sees of a 16-bit value (mpi4py knows no bfloat16)


class WireCodec:
    """Float32 partial sums sent as a 16-bit float type (``dtype``), rounded at each hop."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(dtypes.by_name(name))
        if self.dtype.itemsize != _CARRIER.itemsize:
            raise ValueError(f"a wire type must be 16 bits; {name} is {self.dtype.itemsize * 8}")

    def __repr__(self) -> str:
        return f"WireCodec({self.name!r})"

    def wire_bytes(self, elements: int) -> int:
        """Return the bytes that ``elements`` values take on the wire."""
        return elements * self.dtype.itemsize

    def chunk_elements(self, chunk_bytes: int) -> int:
        """Return the values in a chunk of ``chunk_bytes`` on the wire (one at least)."""
        return max(1, chunk_bytes // self.dtype.itemsize)

    def open(self, pool, backend, src, dst) -> "WireBuffer":
        """Return one call's wire side over 1-D float32 ``src`` and ``dst``, from ``pool``."""
        return WireBuffer(self, pool.get("ring-wire", len(src), _CARRIER), backend, src, dst)


class WireBuffer:
    """One call's wire side: ``bits`` holds what this rank sends and receives, at ``dst``'s offsets.

    A hop adds the received partial sum, widened, to this rank's float32 ``src`` and rounds
    the sum for the next hop. The owner of a segment rounds its finished sum too and keeps
    the rounded value, so every rank ends with the same bits.
    """

    def __init__(self, codec: WireCodec, bits, backend, src, dst):
        self.bits = bits
        self._values = bits.view(codec.dtype)
        self._backend, self._src, self._dst = backend, src, dst

    def narrow(self, lo, hi):
        """Round ``src[lo:hi]`` to the wire type and return its bits, to send."""
        self._backend.unpack(self._src[lo:hi], [0], [self._values[lo:hi]])
        return self.bits[lo:hi]

    def reduce(self, lo, hi, received, op, scale, finished):
        """Round ``op(src[lo:hi], received) * scale`` into the bits; ``finished``: into dst too."""
        values = self._values[lo:hi]
        self._backend.reduce_to_wire(
            values, self._src[lo:hi], received.view(values.dtype), op, scale
        )
        if finished:
            self.widen(lo, hi)

    def widen(self, lo, hi):
        """Write the wire values at ``[lo, hi)`` into ``dst``, exactly, as float32."""
        self._backend.pack([self._values[lo:hi]], self._dst[lo:hi], [0])


_CODECS = {name: WireCodec(name) for name in compression.WIRE_DTYPES}


def by_name(name: str | None) -> WireCodec | None:
    """Return the codec of wire type ``name`` (as metas carry it), or None for no compression."""
    if name is None:
        return None
    try:
        return _CODECS[name]
    except KeyError:
        names = ", ".join(repr(n) for n in _CODECS)
        raise ValueError(f"no wire codec {name!r}; expected one of {names}") from None
