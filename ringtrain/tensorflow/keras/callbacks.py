"""Keras callbacks for data-parallel training: ``ringtrain.keras.callbacks``, on every backend."""

from ringtrain.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    ModelCheckpoint,
)

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "ModelCheckpoint",
]
