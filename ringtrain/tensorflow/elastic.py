"""Elastic states of TensorFlow variables and Keras models (Horovod's ``hvd.elastic``).

A commit copies the variables' values into NumPy arrays, which a relaunched job resumes
from (``ringtrain.elastic``); ``sync`` broadcasts rank 0's variables.
"""

import numpy as np

from ringtrain.elastic import HostsUpdatedInterrupt, ObjectState, State, run
from ringtrain.tensorflow.collectives import broadcast_variables


class _VariablesState(ObjectState):
    """Variables committed as NumPy copies, beside ``ObjectState``'s keyword values."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._saved_values = self._values()

    def _variables(self):
        raise NotImplementedError

    def _values(self):
        return [np.array(variable.numpy(), copy=True) for variable in self._variables()]

    def _assign(self, values):
        variables = self._variables()
        if len(values) != len(variables):
            raise ValueError(
                f"the committed state holds {len(values)} values, but there are "
                f"{len(variables)} variables; build the same model and optimizer before "
                "resuming it"
            )
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)

    def save(self) -> None:
        """Copy the variables' values and the keyword values: they are the committed ones."""
        self._saved_values = self._values()
        super().save()

    def restore(self) -> None:
        """Assign the committed values to the variables and the attributes."""
        self._assign(self._saved_values)
        super().restore()

    def sync(self) -> None:
        """Give every rank rank 0's variables and committed keyword values (collective)."""
        variables = self._variables()
        if variables:
            broadcast_variables(variables, root_rank=0)
        self._saved_values = self._values()
        super().sync()

    def _snapshot(self):
        return {"values": self._saved_values, "objects": super()._snapshot()}

    def _adopt(self, snapshot) -> None:
        self._saved_values = snapshot["values"]
        super()._adopt(snapshot["objects"])


class TensorFlowState(_VariablesState):
    """A list of ``tf.Variable`` and keyword values, committed together.

    ``TensorFlowState(variables, epoch=0)``: TensorFlow 2 has no global variables to take
    by default, so ``variables`` is required.
    """

    def __init__(self, variables, **kwargs):
        self.variables = list(variables)
        super().__init__(**kwargs)

    def _variables(self):
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """A Keras model's variables, its optimizer's, and keyword values, committed together.

    ``optimizer`` defaults to the model's. An optimizer that has not built its variables yet
    is left out until it has, and built when the job resumes a commit that holds them.
    ``backend`` is accepted for Horovod's signature and not used.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self._optimizer = optimizer
        super().__init__(**kwargs)

    @property
    def optimizer(self):
        """The optimizer whose variables are committed, or None."""
        return (
            self._optimizer
            if self._optimizer is not None
            else getattr(self.model, "optimizer", None)
        )

    def _variables(self):
        optimizer = self.optimizer
        built = optimizer is not None and optimizer.built
        return list(self.model.variables) + (list(optimizer.variables) if built else [])

    def _assign(self, values):
        optimizer = self.optimizer
        if (
            len(values) > len(self.model.variables)
            and optimizer is not None
            and not optimizer.built
        ):
            optimizer.build(self.model.trainable_variables)
        super()._assign(values)


__all__ = [
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "run",
]
