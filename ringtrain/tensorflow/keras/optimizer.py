"""``DistributedOptimizer``: any Keras 3 optimizer, applying gradients averaged over ranks.

The wrapper is the user's optimizer class with a small mixin in front of it (public
methods only: ``apply``, ``build``, ``get_config``). Its ``apply`` hands every gradient to
the engine, then lets the class apply the reduced gradients as it always does, so
schedules, clipping, weight decay, EMA and loss scaling keep their meaning.
"""

import keras
import tensorflow as tf

from ringtrain.exchange import alone
from ringtrain.keras.optimizer import (
    DistributedClasses,
    config_to_wrap,
    stock_optimizer_classes,
)
from ringtrain.ops import Average, Min, ReduceOp
from ringtrain.tensorflow import compat
from ringtrain.tensorflow.collectives import allreduce
from ringtrain.tensorflow.compression import Compression, by_name
from ringtrain.tensorflow.exchange import GradientReduction, check_groups, site_name

_CONFIG_KEY = "ringtrain"
_SITE = "DistributedOptimizer"
# Keras's optimizers whose updates only read the gradients they are given (wrappers, whose
# inner optimizers apply them, are left out).
_UPDATES_THAT_READ = frozenset(stock_optimizer_classes()) - {
    keras.optimizers.LossScaleOptimizer,
    keras.optimizers.MultiOptimizer,
}


class _Distributed:
    """Mixin in front of an optimizer class: reduce the gradients, then apply them."""

    ringtrain_distributed = True  # what ``is_distributed`` looks for

    def __init__(self, *args, ringtrain=None, **kwargs):
        super().__init__(*args, **kwargs)
        settings = dict(ringtrain or {})
        passes = settings.pop("backward_passes_per_step", 1)
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        average = settings.pop("average_aggregated_gradients", False)
        if not isinstance(average, bool):
            raise ValueError(f"average_aggregated_gradients must be True or False, got {average!r}")
        compression = settings.pop("compression", Compression.none)
        if isinstance(compression, str):
            compression = by_name(compression)
        op = settings.pop("op", Average)
        if isinstance(op, str):
            op = ReduceOp[op]
        self._rt_reduction = GradientReduction(
            op=op, compression=compression, shared_results=_reads_only(self), **settings
        )
        self._rt_passes = passes
        self._rt_average_passes = average

    def register_local_var(self, var) -> None:
        """Keep the gradient of ``var`` on this rank: it is not exchanged (Horovod's name).

        Registrations are not part of the config: register again after loading a model.
        """
        self._rt_reduction.local_sources.add(var)

    def build(self, variables):
        """Create the optimizer's variables, and the local accumulators if passes > 1.

        Inside a ``LossScaleOptimizer`` (``LossScaleOptimizer(DistributedOptimizer(...))``,
        or what ``compile`` makes under a ``mixed_float16`` policy), that optimizer checks
        the local gradients for overflow before this one reduces them, so one rank could
        skip a step the others take. Its check is made to agree across ranks (one more
        tiny allreduce per step, after backprop); wrapping the other way round,
        ``DistributedOptimizer(LossScaleOptimizer(...))``, needs no such step.
        """
        super().build(variables)
        outer = compat.wrapping_loss_scale_optimizer(self)
        process_set = self._rt_reduction.process_set
        agreed = outer is None or hasattr(outer.check_finite, "ringtrain_agreeing")
        if not agreed and not alone(process_set):  # alone: this rank's check is the answer
            outer.check_finite = _agreeing(outer.check_finite, process_set)
        if self._rt_passes > 1:
            self._rt_accumulators = [
                self.add_variable_from_reference(v, name="ringtrain_accumulator") for v in variables
            ]
            self._rt_count = self.add_variable(
                shape=(), dtype="int64", name="ringtrain_backward_passes"
            )

    def apply(self, grads, trainable_variables=None):
        """Reduce ``grads`` over all ranks, then apply them as the wrapped class does.

        With ``backward_passes_per_step`` k > 1, gradients are summed locally and only
        every k-th call exchanges (and applies) their sum, or their mean with
        ``average_aggregated_gradients``.
        """
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        named = trainable_variables or [None] * len(grads)
        if self._rt_passes == 1:
            reduced = self._rt_reduction(grads, named, _SITE)
            return super().apply(reduced, trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        if len(grads) != len(self._rt_accumulators):
            raise ValueError(
                f"with backward_passes_per_step > 1, apply() takes a gradient for each of "
                f"the {len(self._rt_accumulators)} variables the optimizer was built with; "
                f"got {len(grads)}"
            )
        for accumulator, grad in zip(self._rt_accumulators, grads, strict=True):
            if grad is not None:
                accumulator.assign_add(tf.convert_to_tensor(grad))
        count = self._rt_count.assign_add(1)

        def exchange_and_apply():
            divisor = self._rt_passes if self._rt_average_passes else 1
            aggregated = [
                None if g is None else tf.convert_to_tensor(a) / divisor
                for a, g in zip(self._rt_accumulators, grads, strict=True)
            ]
            reduced = self._rt_reduction(aggregated, named, _SITE)
            super(_Distributed, self).apply(reduced, trainable_variables)
            for accumulator in self._rt_accumulators:
                accumulator.assign(tf.zeros_like(accumulator))

        tf.cond(count % self._rt_passes == 0, exchange_and_apply, lambda: None)
        return None

    def get_config(self):
        """Return the wrapped class's config plus ringtrain's settings."""
        config = super().get_config()
        config[_CONFIG_KEY] = {
            **self._rt_reduction.get_config(),
            "backward_passes_per_step": self._rt_passes,
            "average_aggregated_gradients": self._rt_average_passes,
        }
        return config


def _reads_only(optimizer) -> bool:
    """Return True if Keras's own update applies ``optimizer``'s reduced gradients.

    Those may then be the host's shared results (``exchange.allreduce_gradients``): the
    updates of ``keras.optimizers`` only read gradients, and nothing else sees them. An
    update of another class might slice a gradient, and an op after an aligned slice may
    write into the slice's memory. A ``LossScaleOptimizer`` hands them on to its inner one.
    """
    base = next(c for c in type(optimizer).__mro__ if not issubclass(c, _Distributed))
    if base is keras.optimizers.LossScaleOptimizer:
        return type(optimizer.inner_optimizer) in _UPDATES_THAT_READ
    return base in _UPDATES_THAT_READ


def _agreeing(local_check, process_set):
    def check_finite(grads):
        finite = tf.cast(local_check(grads), tf.int32)
        name = site_name("LossScaleOptimizer.finite", process_set)
        return tf.cast(allreduce(finite, op=Min, name=name, process_set=process_set), tf.bool)

    check_finite.ringtrain_agreeing = True
    return check_finite


def DistributedOptimizer(  # noqa: N802 - Horovod's name for this factory
    optimizer,
    name=None,
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    scale_local_gradients=True,
    process_set=None,
    device_dense="",
    device_sparse="",
    num_groups=0,
    groups=None,
    use_locking=False,
):
    """Return a copy of the Keras ``optimizer`` that applies gradients reduced over all ranks.

    The copy is built from ``optimizer.get_config()`` (wrap before training: state is not
    copied); it is an instance of the same class (``isinstance`` holds) and round-trips
    through ``get_config``/``from_config`` and ``model.save``/``load_model``. With
    ``backward_passes_per_step`` k > 1 it applies, every k-th step, the sum of the k local
    gradients reduced over ranks, or their mean with ``average_aggregated_gradients``, as
    Horovod does. The gradients of variables registered with ``register_local_var`` are
    not exchanged (see ``ringtrain.tensorflow.local_sources``). With ``process_set`` the
    gradients are reduced over that set's ranks only; its config keeps the set's ranks, and
    loading it needs a set of those ranks registered. Horovod's ``device_dense``,
    ``device_sparse``, ``num_groups``, ``groups`` and ``use_locking`` are accepted and have
    no effect (``exchange.check_groups``).
    """
    check_groups(num_groups, groups)
    config = config_to_wrap(optimizer, name)
    config[_CONFIG_KEY] = {
        "op": ReduceOp(op).name,
        "compression": compression.name,
        "sparse_as_dense": sparse_as_dense,
        "gradient_predivide_factor": gradient_predivide_factor,
        "backward_passes_per_step": backward_passes_per_step,
        "average_aggregated_gradients": average_aggregated_gradients,
        "scale_local_gradients": scale_local_gradients,
        "process_set": process_set,
    }
    return CLASSES.of(type(optimizer)).from_config(config)


def PartialDistributedOptimizer(  # noqa: N802 - Horovod's name for this factory
    optimizer, local_layers=None, **kwargs
):
    """Return ``DistributedOptimizer(optimizer, **kwargs)`` keeping ``local_layers`` local.

    ``local_layers``: a Keras layer or a list of them, whose trainable weights' gradients
    are not exchanged (divided by the number of ranks unless ``scale_local_gradients`` is
    False). Build the layers first: their weights must exist.
    """
    distributed = DistributedOptimizer(optimizer, **kwargs)
    distributed._rt_reduction.local_sources.add_layers(local_layers or [])
    return distributed


CLASSES = DistributedClasses(_Distributed, __name__)
register = CLASSES.register
load_model = CLASSES.load_model
register(stock_optimizer_classes())
