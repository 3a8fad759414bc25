"""``DistributedOptimizer`` on Keras's JAX and PyTorch backends: any Keras 3 optimizer.

As on TensorFlow (``ringtrain.tensorflow.keras.optimizer``), the wrapper is the user's
optimizer class with a small mixin in front of it. Its ``apply`` reduces every gradient
over the ranks (``gradients.GradientExchange``), then lets the class apply them as it always
does, so schedules, clipping, weight decay and EMA keep their meaning. On JAX, ``apply``
runs inside the jitted train step (``stateless_apply``), and so does the exchange.
"""

import warnings

import keras

from ringtrain.exchange import alone, registered_process_set
from ringtrain.keras.backprop import BackpropSubmissions
from ringtrain.keras.bridges import backend
from ringtrain.keras.gradients import GradientExchange
from ringtrain.ops import Average, ReduceOp
from ringtrain.process_sets import ProcessSet

_CONFIG_KEY = "ringtrain"
_SITE = "DistributedOptimizer"


def stock_optimizer_classes() -> list[type]:
    """Return the optimizer classes that ``keras.optimizers`` exports."""
    base = keras.optimizers.Optimizer
    found = []
    for name in dir(keras.optimizers):
        value = getattr(keras.optimizers, name)
        if isinstance(value, type) and issubclass(value, base) and value is not base:
            found.append(value)
    return found


def is_distributed(optimizer) -> bool:
    """Return True if ``optimizer`` came from a ``DistributedOptimizer``, on any backend."""
    return bool(getattr(optimizer, "ringtrain_distributed", False))


def config_to_wrap(optimizer, name=None) -> dict:
    """Return the config of the Keras 3 ``optimizer`` that a ``DistributedOptimizer`` copies.

    ``name`` replaces its name. Raises TypeError for anything but a Keras 3 optimizer, and
    ValueError for one that is distributed already.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"expected a Keras 3 optimizer instance, got {type(optimizer).__name__}")
    if is_distributed(optimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return config


class _Distributed:
    """Mixin in front of an optimizer class: reduce the gradients, then apply them."""

    ringtrain_distributed = True  # what ``is_distributed`` looks for

    def __init__(self, *args, ringtrain=None, **kwargs):
        super().__init__(*args, **kwargs)
        settings = dict(ringtrain or {})
        op = settings.pop("op", Average)
        if isinstance(op, str):
            op = ReduceOp[op]
        process_set = settings.pop("process_set", None)
        if process_set is not None and not isinstance(process_set, ProcessSet):
            process_set = registered_process_set(process_set)  # ranks, from a config
        self._rt_in_backprop = bool(settings.pop("hand_over_in_backprop", True))
        self._rt_exchange = GradientExchange(op=op, process_set=process_set, **settings)
        self._rt_backprop = None

    def build(self, variables):
        """Create the optimizer's variables; on PyTorch, hook each one's gradient (``backprop``)."""
        super().build(variables)
        exchange = self._rt_exchange
        hooked = self._rt_in_backprop and backend() == "torch" and not alone(exchange.process_set)
        if hooked and self._rt_backprop is None:
            self._rt_backprop = BackpropSubmissions(
                variables, exchange.start, exchange.site(_SITE), exchange.process_set
            )

    def apply(self, grads, trainable_variables=None):
        """Reduce ``grads`` over all ranks, then apply them as the wrapped class does."""
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        named = trainable_variables or self._trainable_variables or [None] * len(grads)
        submitted = self._rt_backprop.take(named) if self._rt_backprop is not None else None
        reduced = self._rt_exchange(grads, named, self._rt_exchange.site(_SITE), submitted)
        return super().apply(reduced, trainable_variables)

    def get_config(self):
        """Return the wrapped class's config plus ringtrain's settings."""
        config = super().get_config()
        config[_CONFIG_KEY] = {
            **self._rt_exchange.get_config(),
            "hand_over_in_backprop": self._rt_in_backprop,
        }
        return config


class DistributedClasses:
    """The distributed versions of optimizer classes: ``mixin`` in front, made once, loadable.

    Each is registered with Keras as ``ringtrain>Distributed{name}``, so that models saved
    with one load again; ``module`` is where they say they live.
    """

    def __init__(self, mixin, module):
        self._mixin = mixin
        self._module = module
        self._classes: dict[type, type] = {}

    def of(self, base: type) -> type:
        """Return the distributed version of optimizer class ``base``."""
        cls = self._classes.get(base)
        if cls is None:
            cls = type(
                f"Distributed{base.__name__}",
                (self._mixin, base),
                {"__module__": self._module, "__doc__": f"{base.__name__}, reducing over ranks."},
            )
            registered = keras.saving.get_registered_name(base).replace(">", ".")
            register = keras.saving.register_keras_serializable(
                "ringtrain", f"Distributed{registered}"
            )
            cls = self._classes[base] = register(cls)
        return cls

    def register(self, optimizer_classes) -> dict:
        """Make distributed versions of ``optimizer_classes`` loadable; return them by name."""
        found = {}
        for base in optimizer_classes:
            cls = self.of(base)
            found[keras.saving.get_registered_name(cls)] = cls
        return found

    def load_model(self, filepath, custom_optimizers=None, custom_objects=None, **kwargs):
        """Load a model saved with ``model.save``, restoring its ``DistributedOptimizer``.

        Distributed versions of Keras's own optimizers load without help; name your own
        optimizer classes in ``custom_optimizers``. Other keywords go to
        ``keras.models.load_model``.
        """
        objects = self.register(custom_optimizers or ())
        objects.update(custom_objects or {})
        return keras.models.load_model(filepath, custom_objects=objects, **kwargs)


CLASSES = DistributedClasses(_Distributed, __name__)


def DistributedOptimizer(  # noqa: N802 - Horovod's name for this factory
    optimizer,
    name=None,
    op=Average,
    gradient_predivide_factor=1.0,
    process_set=None,
    backward_passes_per_step=1,
    hand_over_in_backprop=True,
    **horovod_options,
):
    """Return a copy of the Keras ``optimizer`` that applies gradients reduced over all ranks.

    The copy is built from ``optimizer.get_config()`` (wrap before training: state is not
    copied); it is an instance of the same class and round-trips through ``get_config``.
    ``gradient_predivide_factor`` and ``process_set`` are as on TensorFlow. Horovod's
    ``compression``, ``sparse_as_dense``, ``device_dense``, ``device_sparse``, ``num_groups``,
    ``groups`` and ``use_locking`` are accepted and have no effect here (a compression other
    than none warns): these backends' gradients are dense, and the engine fuses what is
    ready. ``backward_passes_per_step`` above 1 is TensorFlow's alone for now (a ValueError
    here). On PyTorch each gradient
    is handed over the moment backprop has it (``backprop``), unless
    ``hand_over_in_backprop`` is False.
    """
    unknown = set(horovod_options) - {
        "compression", "sparse_as_dense", "device_dense", "device_sparse", "num_groups",
        "groups", "use_locking", "average_aggregated_gradients", "scale_local_gradients",
    }  # fmt: skip
    if unknown:
        raise TypeError(f"DistributedOptimizer() got unexpected arguments {sorted(unknown)}")
    if backward_passes_per_step != 1:
        raise ValueError(
            f"backward_passes_per_step={backward_passes_per_step!r}: only 1 is supported on "
            f"the {keras.backend.backend()} backend (TensorFlow's takes more)"
        )
    compression = horovod_options.get("compression")
    if getattr(compression, "name", "none") != "none":
        warnings.warn(
            f"ringtrain: compression {compression.name!r} is not applied on the "
            f"{keras.backend.backend()} backend: gradients cross at their own precision",
            stacklevel=2,
        )
    config = config_to_wrap(optimizer, name)
    config[_CONFIG_KEY] = {
        "op": ReduceOp(op).name,
        "gradient_predivide_factor": gradient_predivide_factor,
        "process_set": process_set,
        "hand_over_in_backprop": hand_over_in_backprop,
    }
    return CLASSES.of(type(optimizer)).from_config(config)
