"""``DistributedGradientTape``: a ``tf.GradientTape`` whose gradients are reduced over ranks."""

import tensorflow as tf

from ringtrain.ops import Average
from ringtrain.tensorflow.compression import Compression
from ringtrain.tensorflow.exchange import GradientReduction, check_groups


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``: ``gradient()`` returns gradients reduced over all ranks.

    Each gradient goes to the engine as soon as it is computed (last layers first inside
    ``tf.function``); every rank must ask for gradients of the same sources in the same
    structure. With ``process_set`` they are reduced over that set's ranks only. Horovod's
    ``device_dense``, ``device_sparse``, ``num_groups`` and ``groups`` are accepted and have
    no effect (``exchange.check_groups``). The
    gradients of sources registered with ``register_local_source`` stay on their rank (see
    ``ringtrain.tensorflow.local_sources``). Everything else (``watch``,
    ``stop_recording``, ...) is the wrapped tape's.
    """

    def __init__(
        self,
        gradtape,
        compression=Compression.none,
        sparse_as_dense=False,
        op=Average,
        gradient_predivide_factor=1.0,
        scale_local_gradients=True,
        process_set=None,
        device_dense="",
        device_sparse="",
        num_groups=0,
        groups=None,
    ):
        check_groups(num_groups, groups)
        self._tape = gradtape
        self._reduction = GradientReduction(
            op,
            compression,
            sparse_as_dense,
            gradient_predivide_factor,
            scale_local_gradients,
            process_set,
        )

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._tape.__exit__(*exc_info)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def register_local_source(self, source) -> None:
        """Keep the gradient of ``source`` (a variable) on this rank: it is not exchanged."""
        self._reduction.local_sources.add(source)

    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        """Return the gradients of ``target`` for ``sources``, reduced over all ranks."""
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        reduced = self._reduction(
            tf.nest.flatten(grads), tf.nest.flatten(sources), "DistributedGradientTape"
        )
        return tf.nest.pack_sequence_as(grads, reduced)


def PartialDistributedGradientTape(gradtape, local_layers=None, **kwargs):  # noqa: N802
    """Return ``DistributedGradientTape(gradtape, **kwargs)`` keeping ``local_layers`` local.

    Horovod's name. ``local_layers``: a Keras layer or a list of them, whose trainable
    weights' gradients are not exchanged (divided by the number of ranks unless
    ``scale_local_gradients`` is False).
    """
    tape = DistributedGradientTape(gradtape, **kwargs)
    tape._reduction.local_sources.add_layers(local_layers or [])
    return tape
