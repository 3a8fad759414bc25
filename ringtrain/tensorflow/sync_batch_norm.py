"""``SyncBatchNormalization``: Keras batch normalization with statistics over every rank's batch.

In training, each rank takes, per channel, its batch's element count, mean and sum of squared
deviations; one allreduce (float64, differentiable) adds up what those give, and the mean and
variance of all ranks' batches together follow. So every rank normalizes with the same
statistics, whatever the size of each batch (an empty one included), and the moving averages
move alike on every rank. Outside training, and in a job of one rank (as Horovod's), the layer
is Keras's own ``BatchNormalization``.
"""

import keras
import tensorflow as tf

from ringtrain.exchange import alone
from ringtrain.ops import Sum
from ringtrain.tensorflow.collectives import allreduce


@keras.saving.register_keras_serializable("ringtrain")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics span all ranks (Horovod's).

    Takes BatchNormalization's arguments, except ``renorm``. Every rank must call the layer
    the same number of times per step, in the same order; its allreduce is named after the
    layer, so ranks whose layers differ in channels get ``MismatchError`` naming it.
    ``synchronized`` is accepted and changes nothing: the statistics are always synchronized.
    """

    def __init__(self, *args, **kwargs):
        if kwargs.get("renorm"):
            raise ValueError(
                "SyncBatchNormalization does not support renorm=True; use renorm=False, or "
                "keras.layers.BatchNormalization for batch renormalization on each rank alone"
            )
        super().__init__(*args, **kwargs)

    def call(self, inputs, training=None, mask=None):
        """Normalize ``inputs`` (with all ranks' batch statistics when training)."""
        if not (training and self.trainable) or alone():  # alone: this batch is every batch
            return super().call(inputs, training=training, mask=mask)
        wide = tf.float64 if inputs.dtype == tf.float64 else tf.float32
        x = tf.cast(inputs, wide)
        mean, variance = self._global_moments(x, mask)
        momentum = tf.cast(self.momentum, self.moving_mean.dtype)
        for moving, value in ((self.moving_mean, mean), (self.moving_variance, variance)):
            value = tf.cast(value, moving.dtype)
            moving.assign(moving * momentum + value * (1 - momentum))
        shape = self._channel_shape(x)
        y = tf.nn.batch_normalization(
            x,
            tf.reshape(mean, shape),
            tf.reshape(variance, shape),
            None if self.beta is None else tf.reshape(tf.cast(self.beta, wide), shape),
            None if self.gamma is None else tf.reshape(tf.cast(self.gamma, wide), shape),
            self.epsilon,
        )
        return tf.cast(y, self.compute_dtype)

    def _channel_shape(self, x):
        """Return the shape that lines per-channel values up with ``x`` along ``self.axis``."""
        rank = x.shape.rank
        shape = [1] * rank
        shape[self.axis % rank] = -1
        return shape

    def _global_moments(self, x, mask):
        """Return the per-channel mean and (biased) variance of every rank's ``x`` together.

        With ``mask`` (``x``'s shape without its last axis), only unmasked elements count.
        Each rank sends its count n, n times its mean, and its sum of squared deviations
        plus n times its mean squared, in float64: the totals then give the variance
        without the cancellation that sums of squares suffer where the mean is large.
        """
        rank = x.shape.rank
        channel = self.axis % rank
        axes = [a for a in range(rank) if a != channel]
        shape = self._channel_shape(x)
        if mask is None:
            channels = tf.shape(x)[channel]
            count = tf.fill([channels], tf.cast(tf.size(x) // channels, x.dtype))
            weights = 1
        else:
            if mask.shape.rank != rank - 1:
                raise ValueError(
                    f"the mask must have one dimension less than the inputs: got a mask of "
                    f"shape {mask.shape} for inputs of shape {x.shape}"
                )
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
            count = tf.reduce_sum(weights, axes)
        mean = tf.math.divide_no_nan(tf.reduce_sum(x * weights, axes), count)
        deviations = tf.reduce_sum(tf.square((x - tf.reshape(mean, shape)) * weights), axes)
        count, mean, deviations = (tf.cast(t, tf.float64) for t in (count, mean, deviations))
        local = tf.concat([count, count * mean, deviations + count * tf.square(mean)], 0)
        total = allreduce(local, op=Sum, name=f"SyncBatchNormalization.{self.name}")
        n, sums, squares = tf.split(total, 3)
        mean = sums / n
        variance = tf.maximum(squares / n - tf.square(mean), 0)
        return tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)
