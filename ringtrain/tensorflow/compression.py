"""Compression strategies for the TF binding: the core's own (``ringtrain.compression``).

``Compression.fp16`` and ``Compression.bf16`` leave tensors alone in TensorFlow and have the
ring send 16-bit partial sums (their ``wire_dtype``); a user's own Horovod-style strategy,
without ``wire_dtype``, runs its ``compress`` and ``decompress`` around the reduction.
"""

from ringtrain.compression import Compression, by_name, wire_dtype

__all__ = ["Compression", "by_name", "for_engine"]


def for_engine(compression):
    """Return what the engine applies of ``compression``: itself if it sends 16-bit values.

    None for ``Compression.none`` and for a user's own strategy, which works in TensorFlow.
    """
    return compression if wire_dtype(compression) is not None else None
