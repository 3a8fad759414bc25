"""The current Keras backend's tensors as NumPy arrays and back, for the hand-over.

On PyTorch a CPU tensor and its array share memory; a GPU tensor is copied to the host.
PyTorch has no bfloat16 NumPy dtype: such tensors cross as their bits (``ml_dtypes``).
"""

import keras
import ml_dtypes
import numpy as np


def backend() -> str:
    """Return the Keras backend in use: ``"tensorflow"``, ``"jax"`` or ``"torch"``."""
    return keras.backend.backend()


def to_numpy(tensor) -> np.ndarray:
    """Return ``tensor`` (a backend tensor or a Keras variable) as a NumPy array."""
    value = getattr(tensor, "value", tensor)  # a keras.Variable's backend tensor
    if isinstance(value, np.ndarray | np.generic | int | float | bool):
        return np.asarray(value)
    if backend() == "torch":
        import torch

        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()
    return np.asarray(keras.ops.convert_to_numpy(value))


def like(array: np.ndarray, reference):
    """Return NumPy ``array`` as a backend tensor of ``reference``'s dtype, on its device."""
    if backend() == "torch":
        import torch

        if array.dtype == ml_dtypes.bfloat16:
            tensor = torch.from_numpy(np.asarray(array, order="C").view(np.int16))
            tensor = tensor.view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(np.asarray(array, order="C"))
        return tensor.to(device=reference.device, dtype=reference.dtype)
    return keras.ops.convert_to_tensor(array, dtype=reference.dtype)


def variable_label(variable, index: int) -> str:
    """Return how error messages name ``variable`` (a Keras or tf variable, or a tensor)."""
    for attribute in ("path", "name"):
        label = getattr(variable, attribute, None)
        if isinstance(label, str) and label:
            return label
    return f"#{index}"
