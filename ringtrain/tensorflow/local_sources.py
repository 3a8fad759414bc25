"""Variables whose gradients stay on their own rank (Horovod's local sources and local layers).

A rank's copy of a local variable trains on that rank's gradient alone: the gradient is
never exchanged. As in Horovod, it is divided by the number of ranks reducing (those of
the process set, if any) unless ``scale_local_gradients`` is False.
"""

import keras
import tensorflow as tf


class LocalSources:
    """The variables registered as local on this rank, matched by identity."""

    def __init__(self, scale_gradients=True):
        if not isinstance(scale_gradients, bool):
            raise ValueError(
                f"scale_local_gradients must be True or False, got {scale_gradients!r}"
            )
        self.scale_gradients = scale_gradients
        self._held = {}  # id -> variable: holding it keeps its id from being reused

    def add(self, variable) -> None:
        """Register ``variable`` (a ``keras.Variable`` or ``tf.Variable``) as local."""
        if not isinstance(variable, (keras.Variable, tf.Variable)):
            raise TypeError(
                f"a local source must be a keras.Variable or tf.Variable, got "
                f"{type(variable).__name__} ({variable!r})"
            )
        self._held[id(variable)] = variable

    def add_layers(self, layers) -> None:
        """Register the trainable weights of ``layers`` (a Keras layer or a list of them)."""
        if isinstance(layers, keras.layers.Layer):
            layers = [layers]
        for layer in layers:
            if not isinstance(layer, keras.layers.Layer):
                raise TypeError(
                    f"local_layers must be Keras layers, got {type(layer).__name__} ({layer!r})"
                )
            if not layer.built:
                raise ValueError(
                    f"local layer {layer.name!r} is not built yet, so it has no weights to "
                    "register; build the model (call it once, or pass an Input) first"
                )
            for variable in layer.trainable_weights:
                self.add(variable)

    def __contains__(self, variable) -> bool:
        return id(variable) in self._held

    def __bool__(self) -> bool:
        return bool(self._held)

    def gradient(self, grad, size):
        """Return what a local variable's gradient ``grad`` becomes among ``size`` ranks."""
        if grad is None or not self.scale_gradients:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            values = grad.values / tf.cast(size, grad.values.dtype)
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        grad = tf.convert_to_tensor(grad)
        return grad / tf.cast(size, grad.dtype)
