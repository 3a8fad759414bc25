"""Compression strategies: ``compress -> (tensor, ctx)`` and ``decompress(tensor, ctx)``."""

import tensorflow as tf


class NoneCompressor:
    """Sends tensors as they are."""

    name = "none"

    @staticmethod
    def compress(tensor):
        """Return ``tensor`` unchanged and no context."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Return ``tensor`` unchanged."""
        return tensor


class FP16Compressor:
    """Sends float32 and float64 tensors as float16 and casts the result back."""

    name = "fp16"

    @staticmethod
    def compress(tensor):
        """Return ``tensor`` as float16 (if wider float) and its original dtype as context."""
        if tensor.dtype in (tf.float32, tf.float64):
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Cast ``tensor`` back to the dtype ``compress`` recorded."""
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The strategies by their Horovod names: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def by_name(name: str):
    """Return the strategy called ``name`` ("none" or "fp16"), as ``get_config`` stores it."""
    for strategy in (NoneCompressor, FP16Compressor):
        if strategy.name == name:
            return strategy
    raise ValueError(f"unknown compression {name!r}; expected 'none' or 'fp16'")
