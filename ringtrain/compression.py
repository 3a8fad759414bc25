"""Horovod's compression strategies, framework-neutral: which 16-bit type values cross the link.

A strategy is Horovod's pair ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx)``, plus ``wire_dtype``: ringtrain's own strategies leave the tensor
alone and name the 16-bit type (``"float16"``, ``"bfloat16"``) that the ring sends instead of
float32, rounding each partial sum once per hop and adding in float32. A user's own strategy
has no ``wire_dtype``: its ``compress`` and ``decompress`` do all the work, as in Horovod.
"""

WIRE_DTYPES = ("float16", "bfloat16")


class NoneCompressor:
    """Sends tensors as they are."""

    name = "none"
    wire_dtype = None

    @staticmethod
    def compress(tensor):
        """Return ``tensor`` unchanged and no context."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Return ``tensor`` unchanged."""
        return tensor


class FP16Compressor(NoneCompressor):
    """Sends the partial sums of float32 reductions as float16: half the bytes on the link."""

    name = "fp16"
    wire_dtype = "float16"


class BF16Compressor(NoneCompressor):
    """Sends the partial sums of float32 reductions as bfloat16: half the bytes on the link."""

    name = "bf16"
    wire_dtype = "bfloat16"


class Compression:
    """The strategies by their Horovod names: ``none``, ``fp16``, and ringtrain's ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


_BY_NAME = {s.name: s for s in (NoneCompressor, FP16Compressor, BF16Compressor)}


def by_name(name: str):
    """Return the strategy called ``name`` ("none", "fp16" or "bf16"), as configs store it."""
    try:
        return _BY_NAME[name]
    except KeyError:
        names = ", ".join(repr(n) for n in _BY_NAME)
        raise ValueError(f"unknown compression {name!r}; expected one of {names}") from None


def wire_dtype(compression) -> str | None:
    """Return the 16-bit type that ``compression`` sends (None: values cross as they are).

    ``compression`` is None, a strategy above, or any object with a ``wire_dtype``
    attribute; a user's own strategy without one sends values as its ``compress`` left them.
    """
    wire = getattr(compression, "wire_dtype", None)
    if wire is not None and wire not in WIRE_DTYPES:
        raise ValueError(
            f"compression {compression!r} has wire_dtype {wire!r}; expected None or one of "
            f"{', '.join(WIRE_DTYPES)}"
        )
    return wire
