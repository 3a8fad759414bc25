"""The local route: a reduction over one rank, or over no elements, copies and scales."""

from ringtrain import kernels


def copy_scaled(src, dst, postscale: float) -> None:
    """Write ``src`` times ``postscale`` to ``dst`` (which may be ``src``)."""
    if len(src) and (src is not dst or postscale != 1.0):
        kernels.backend_for(dst).pack([src], dst, [0], postscale)
