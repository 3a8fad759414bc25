"""Elastic training with ``model.fit``: Horovod's ``KerasState`` and its three callbacks.

Keras 3's ``fit`` cannot start an epoch partway. A job resumed from a commit made inside an
epoch runs that epoch again from its first batch, from the committed weights; commit at
epoch ends only (``CommitStateCallback(state, batches_per_commit=0)``) to resume exactly.
"""

import keras

from ringtrain.elastic import HostsUpdatedInterrupt, ObjectState, State, run
from ringtrain.tensorflow.elastic import TensorFlowKerasState


class KerasState(TensorFlowKerasState):
    """A Keras model, its optimizer (default: the model's) and keyword values, committed."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches (0: none), and between epochs.

    The commit between epochs is taken when the next epoch begins, and when training ends,
    so that callbacks listed after this one have updated the state at the epoch's end.
    """

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int):
            raise TypeError(f"batches_per_commit must be an int, not {batches_per_commit!r}")
        if batches_per_commit < 0:
            raise ValueError(f"batches_per_commit must be >= 0, not {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._batches = 0
        self._epoch_ended = False

    def on_train_begin(self, logs=None):
        """Count batches from this ``fit``'s start."""
        self._batches = 0
        self._epoch_ended = False

    def on_epoch_begin(self, epoch, logs=None):
        """Commit the epoch that ended before this one."""
        self._commit_ended_epoch()

    def on_train_batch_end(self, batch, logs=None):
        """Commit once every ``batches_per_commit`` batches."""
        self._batches += 1
        if self.batches_per_commit and self._batches % self.batches_per_commit == 0:
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        """Mark the epoch for a commit once every callback has seen its end."""
        self._epoch_ended = True

    def on_train_end(self, logs=None):
        """Commit the last epoch."""
        self._commit_ended_epoch()

    def _commit_ended_epoch(self):
        if self._epoch_ended:
            self._epoch_ended = False
            self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the index of the last finished batch, and 0 between epochs."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        """Record ``batch``."""
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        """Start the count again for the next epoch."""
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs finished, over every launch of the job.

    ``fit`` numbers its epochs from 0 (or its ``initial_epoch``); pass it
    ``epochs=total - state.epoch`` so that a resumed job finishes the epochs left.
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._first = state.epoch

    def on_train_begin(self, logs=None):
        """Take the epochs finished before this ``fit`` from the state."""
        self._first = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        """Count ``epoch`` as finished."""
        self.state.epoch = self._first + epoch + 1


__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
