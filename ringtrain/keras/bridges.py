"""The bridges between Keras's JAX and PyTorch backends and the framework-neutral exchange.

A bridge (``ringtrain.exchange.Bridge``) converts the backend's tensors to NumPy arrays and
back, and runs the hand-over's host code where the backend can:

- PyTorch: eagerly. A CPU tensor and its array share memory; a GPU tensor is copied to
  the host. PyTorch has no bfloat16 NumPy dtype: such tensors cross as their bits.
- JAX: from inside the jitted step, through one host callback (``buffer_callback``), which
  reads the gradients in XLA's buffers and writes the results over them. XLA waits in it,
  so the exchange cannot overlap backprop there (``jax_threads`` says what the CPU client
  needs for it).
"""

import keras
import ml_dtypes
import numpy as np


def backend() -> str:
    """Return the Keras backend in use: ``"tensorflow"``, ``"jax"`` or ``"torch"``."""
    return keras.backend.backend()


class TorchBridge:
    """PyTorch's tensors, handed over eagerly."""

    @staticmethod
    def to_numpy(tensor) -> np.ndarray:
        """Return ``tensor`` (a tensor, a Keras variable or a NumPy value) as a NumPy array."""
        import torch

        value = getattr(tensor, "value", tensor)  # a keras.Variable's backend tensor
        if not torch.is_tensor(value):
            return np.asarray(value)
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()

    @staticmethod
    def from_numpy(array, like):
        """Return NumPy ``array`` as a tensor of ``like``'s dtype, on its device."""
        import torch

        array = np.asarray(array, order="C")
        if array.dtype == ml_dtypes.bfloat16:
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return tensor.to(device=like.device, dtype=like.dtype)

    def on_host(self, function, tensors) -> list:
        """Return ``function``'s arrays, for ``tensors``' arrays, as tensors like them."""
        results = function(*(self.to_numpy(t) for t in tensors))
        return [self.from_numpy(r, t) for r, t in zip(results, tensors, strict=True)]


class JaxBridge:
    """JAX's arrays, handed over from inside the jitted step."""

    @staticmethod
    def to_numpy(tensor) -> np.ndarray:
        """Return ``tensor`` (an array, a Keras variable or a NumPy value) as a NumPy array."""
        return np.asarray(keras.ops.convert_to_numpy(getattr(tensor, "value", tensor)))

    @staticmethod
    def from_numpy(array, like):
        """Return NumPy ``array`` as a JAX array of ``like``'s dtype."""
        return keras.ops.convert_to_tensor(array, dtype=like.dtype)

    def on_host(self, function, tensors) -> list:
        """Return ``function``'s arrays for ``tensors``' arrays, from one host callback.

        The callback (``buffer_callback``) reads the gradients where XLA holds them and
        writes each result over its gradient's buffer, which XLA hands on as the output.
        """
        import jax
        from jax.experimental.buffer_callback import buffer_callback

        from ringtrain.keras import jax_threads

        jax_threads.check()
        shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]

        def on_buffers(context, outputs, *inputs):
            results = function(*(np.asarray(b) for b in inputs))
            for out, result in zip(outputs, results, strict=True):
                np.copyto(np.asarray(out), result, casting="same_kind")

        aliases = {i: i for i in range(len(tensors))}  # each result in its gradient's buffer
        callback = buffer_callback(
            on_buffers, shapes, has_side_effect=True, input_output_aliases=aliases
        )
        return list(callback(*tensors))


def for_backend(name=None):
    """Return the bridge of Keras backend ``name`` (default: the one in use)."""
    name = name or backend()
    if name == "torch":
        return TorchBridge()
    if name == "jax":
        return JaxBridge()
    raise ValueError(f"no ringtrain.keras bridge for the {name!r} backend (jax or torch)")
