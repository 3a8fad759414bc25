"""Keras callbacks for data-parallel training: broadcast, metric averaging, learning rates, saving.

They run on every Keras backend. On TensorFlow each also turns a model's ``jit_compile`` off
(with a warning) when its optimizer is a ``DistributedOptimizer``: the exchange runs outside
XLA. On JAX the exchange is a host callback inside the jitted step, which XLA runs.
"""

import math
import numbers
import os
import tempfile
import warnings

import keras
import numpy as np

from ringtrain import api
from ringtrain.keras.bridges import backend
from ringtrain.keras.optimizer import is_distributed
from ringtrain.keras.variables import broadcast_variables


def _uses_distributed_optimizer(model) -> bool:
    optimizer = getattr(model, "optimizer", None)
    return is_distributed(optimizer) or is_distributed(getattr(optimizer, "inner_optimizer", None))


class _Callback(keras.callbacks.Callback):
    """Base of ringtrain's callbacks: keeps XLA away from the distributed train step."""

    def set_model(self, model):
        """Attach ``model``; switch its ``jit_compile`` off if it would break the exchange."""
        super().set_model(model)
        if (
            backend() == "tensorflow"
            and getattr(model, "jit_compile", False)
            and _uses_distributed_optimizer(model)
        ):
            warnings.warn(
                "ringtrain: the model was compiled with jit_compile=True, but its "
                "DistributedOptimizer exchanges gradients outside XLA; training with "
                "jit_compile=False instead",
                stacklevel=2,
            )
            model.jit_compile = False


class BroadcastGlobalVariablesCallback(_Callback):
    """At the start of the first ``fit``, give every rank ``root_rank``'s model and optimizer.

    Keras builds the optimizer before training starts, so its state (slots, iteration
    count) is broadcast together with the model's weights. ``local_variables`` (a variable
    or a list of them) keep each rank's own value; ``device`` is Horovod's and has no effect.
    """

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, list | tuple | set):
            local_variables = [local_variables]
        self.local_variables = {id(v) for v in local_variables}

    def on_train_begin(self, logs=None):
        """Broadcast once; later ``fit`` calls keep the ranks' identical state."""
        if self.broadcast_done:
            return
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            variables += list(optimizer.variables)
        variables = [v for v in variables if id(v) not in self.local_variables]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """At each epoch's end, replace every numeric log (metrics, val_ metrics) by its mean.

    List it before callbacks that read metrics (checkpoints, early stopping, schedules).
    """

    def on_epoch_end(self, epoch, logs=None):
        """Average the numeric entries of ``logs`` over all ranks, in place."""
        if logs is None:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, numbers.Real))
        everyone = api.allgather_object(names, name="MetricAverageCallback.names")
        if any(other != names for other in everyone):
            raise ValueError(f"ranks log different metrics at epoch {epoch}: {everyone}")
        values = np.array([float(logs[k]) for k in names], np.float64)
        mean = api.allreduce(values, name="MetricAverageCallback.values", op=api.Average)
        logs.update(zip(names, (float(v) for v in mean), strict=True))


class LearningRateScheduleCallback(_Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from start to end epoch.

    ``multiplier`` is a number or a function of the epoch. With ``staircase`` the rate
    changes at epoch starts; otherwise before every batch, with a fractional epoch
    (``steps_per_epoch`` defaults to what ``fit`` reports). The optimizer's learning rate
    must be a number (a variable), not a ``LearningRateSchedule``.
    """

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=False,
        steps_per_epoch=None,
        verbose=0,
    ):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = math.inf if end_epoch is None else end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        if momentum_correction:
            warnings.warn(
                "ringtrain: momentum_correction is not applied: Keras 3 optimizers fix "
                "their momentum when the train step is traced",
                stacklevel=2,
            )

    def _active(self, epoch) -> bool:
        return self.start_epoch <= epoch < self.end_epoch

    def _set(self, epoch):
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_begin(self, epoch, logs=None):
        """Remember the epoch; with ``staircase``, set this epoch's rate."""
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)
            if self.verbose and api.rank() == 0:
                rate = float(np.asarray(self.model.optimizer.learning_rate))
                print(f"\nEpoch {epoch + 1}: learning rate set to {rate:.6g}")

    def on_train_batch_begin(self, batch, logs=None):
        """Without ``staircase``, set the rate for this batch's fractional epoch."""
        if self.staircase or not self._active(self.current_epoch):
            return
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError("set steps_per_epoch: fit() did not report the steps per epoch")
        self._set(self.current_epoch + batch / steps)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the rate from ``initial_lr / size`` up to ``initial_lr`` over ``warmup_epochs``.

    The ramp is linear in the fractional epoch (Goyal et al., 2017); ``initial_lr`` is the
    rate for the full world size, usually the single-process rate times ``size()``.
    """

    def __init__(
        self,
        initial_lr,
        warmup_epochs=5,
        momentum_correction=False,
        steps_per_epoch=None,
        verbose=0,
    ):
        def multiplier(epoch):
            n = api.size()
            return (epoch * (n - 1) / warmup_epochs + 1) / n

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
            verbose=verbose,
        )
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        """After the last warmup epoch, set the full rate."""
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and api.rank() == 0:
                print(f"\nEpoch {epoch + 1}: warmup done, learning rate {self.initial_lr:.6g}")


class ModelCheckpoint(_Callback):
    """Saves the model (or its weights) at each epoch's end, from rank 0 only, atomically.

    The file is written under a temporary name in the same folder, flushed to disk, and
    renamed over ``filepath`` (which may hold ``{epoch}`` and log names, as in Keras), so
    a crash mid-write leaves the previous checkpoint intact. With ``save_best_only`` it
    saves only when ``monitor`` improves (``mode`` "min", "max", or "auto": "max" for
    accuracies).
    """

    def __init__(
        self,
        filepath,
        monitor="val_loss",
        save_best_only=False,
        save_weights_only=False,
        mode="auto",
        verbose=0,
    ):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        if mode == "auto":
            mode = "max" if "acc" in monitor else "min"
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.verbose = verbose
        self.best = -math.inf if mode == "max" else math.inf

    def _improved(self, value) -> bool:
        return value > self.best if self.mode == "max" else value < self.best

    def on_epoch_end(self, epoch, logs=None):
        """On rank 0, save if due."""
        if api.rank() != 0:
            return
        logs = logs or {}
        if self.save_best_only:
            value = logs.get(self.monitor)
            if value is None:
                warnings.warn(
                    f"ringtrain: cannot save best model: no {self.monitor!r} in logs", stacklevel=2
                )
                return
            if not self._improved(value):
                return
            self.best = value
        path = self.filepath.format(epoch=epoch + 1, **logs)
        self.save(path)
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: saved {path}")

    def save(self, path):
        """Write the model to ``path`` atomically (temporary file, fsync, rename)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        # Keras picks the format from the suffix, so the temporary file keeps it.
        suffix = ".weights.h5" if path.endswith(".weights.h5") else os.path.splitext(path)[1]
        handle, temporary = tempfile.mkstemp(prefix=".ringtrain-", suffix=suffix, dir=folder)
        os.close(handle)
        try:
            if self.save_weights_only:
                self.model.save_weights(temporary, overwrite=True)
            else:
                self.model.save(temporary, overwrite=True)
            with open(temporary, "rb") as written:
                os.fsync(written.fileno())
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
