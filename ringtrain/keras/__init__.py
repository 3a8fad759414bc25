"""ringtrain for Keras 3 on any backend (import it as ``hvd``): the one ``keras.backend`` uses.

On TensorFlow it is ``ringtrain.tensorflow.keras``, all of it. On JAX and PyTorch it is
``ringtrain.keras.portable``: ``DistributedOptimizer``, ``broadcast_variables``, the
callbacks and the process-level API, through the framework-neutral ``ringtrain.exchange``.
The choice is made when a name is first looked up, so importing this package imports no
framework that the backend does not use.
"""

import importlib

import keras


def _implementation():
    if keras.backend.backend() == "tensorflow":
        return importlib.import_module("ringtrain.tensorflow.keras")
    return importlib.import_module("ringtrain.keras.portable")


def __getattr__(name):
    return getattr(_implementation(), name)


def __dir__():
    return sorted(_implementation().__all__)
