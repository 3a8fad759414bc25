"""Compression strategies for the TF binding: Horovod's casts, and ringtrain's 16-bit ring.

``Compression.fp16`` and ``Compression.bf16`` have Horovod's ``compress`` (floating tensors
cast to 16 bits, the dtype kept as context) and ``decompress`` (cast back), for code that
calls them. ringtrain's collectives do not call them: the tensors stay as they are in
TensorFlow and the ring sends 16-bit partial sums (their ``wire_dtype``). A user's own
Horovod-style strategy, without ``wire_dtype``, runs its ``compress`` and ``decompress``
around the reduction.
"""

import tensorflow as tf

from ringtrain import compression as core
from ringtrain.compression import wire_dtype

__all__ = ["Compression", "around_reduction", "by_name", "for_engine"]


class _Casting:
    """Horovod's ``compress`` and ``decompress``: floating tensors to ``wire_dtype`` and back."""

    @classmethod
    def compress(cls, tensor):
        """Return ``tensor`` cast to 16 bits if it is floating, and the dtype to restore."""
        if not tensor.dtype.is_floating:
            return tensor, None
        return tf.cast(tensor, cls.wire_dtype), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Return ``tensor`` cast back to the dtype that ``compress`` kept (None: unchanged)."""
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_Casting, core.FP16Compressor):
    """float16: Horovod's casts, and float16 partial sums on the ring."""


class BF16Compressor(_Casting, core.BF16Compressor):
    """bfloat16: casts as Horovod's fp16 does, and bfloat16 partial sums on the ring."""


class Compression:
    """The strategies by their Horovod names: ``none``, ``fp16``, and ringtrain's ``bf16``."""

    none = core.NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def by_name(name: str):
    """Return the strategy called ``name`` ("none", "fp16" or "bf16"), as configs store it."""
    return getattr(Compression, core.by_name(name).name)


def for_engine(compression):
    """Return what the engine applies of ``compression``: itself if it sends 16-bit values.

    None for ``Compression.none`` and for a user's own strategy, which works in TensorFlow.
    """
    return compression if wire_dtype(compression) is not None else None


def around_reduction(compression):
    """Return the strategy whose ``compress`` and ``decompress`` run around a reduction.

    ``compression`` itself for a user's own strategy; none for one that the ring applies.
    """
    return core.NoneCompressor if for_engine(compression) is not None else compression
