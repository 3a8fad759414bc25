"""On Keras's PyTorch backend, each gradient goes to the engine the moment backprop has it.

Keras's PyTorch trainer runs ``loss.backward()`` and only then the optimizer's ``apply``. A
hook on each trainable variable (``Tensor.register_post_accumulate_grad_hook``) submits its
gradient as soon as autograd has accumulated it, so the engine reduces (and fuses) the last
layers' gradients while autograd still computes the earlier ones, as the TensorFlow
binding's ops do. ``apply`` then submits the manifest and whatever no hook submitted, and
collects every result (``gradients.GradientExchange``).

A gradient that a hook submits is read in place while autograd goes on, so a second
``backward()`` before ``apply`` (accumulating into it) is refused, with an error that says
so; ``DistributedOptimizer(..., hand_over_in_backprop=False)`` hands every gradient over in
``apply`` instead.
"""

from ringtrain.errors import RingtrainError
from ringtrain.exchange import part_name, withdraw
from ringtrain.keras.bridges import TorchBridge


class BackpropSubmissions:
    """The hooks on ``variables`` (Keras variables of the PyTorch backend) and what they sent.

    ``start`` is the exchange's ``Part.start``; ``site`` prefixes the names, as the
    exchange's own parts are named, so that ``apply`` collects the same submissions;
    ``process_set`` is the ranks they go to.
    """

    def __init__(self, variables, start, site, process_set=None):
        self._process_set = process_set
        self._submitted: dict[int, object] = {}  # id(variable) -> handle, since ``take``
        for entry, variable in enumerate(variables):
            parameter = variable.value
            if parameter.requires_grad:
                hook = self._hook(variable, start(part_name(site, entry)))
                parameter.register_post_accumulate_grad_hook(hook)

    def _hook(self, variable, submit):
        key = id(variable)

        def submitted(parameter):
            if key in self._submitted:
                raise RingtrainError(
                    f"ringtrain: the gradient of {variable.path} was accumulated again before "
                    "the optimizer applied it: its first was handed over already and is being "
                    "read in place. Apply after each backward(), or wrap the optimizer with "
                    "DistributedOptimizer(..., hand_over_in_backprop=False)"
                )
            self._submitted[key] = submit(TorchBridge.to_numpy(parameter.grad))

        return submitted

    def take(self, variables) -> dict:
        """Return entry -> handle of ``variables``' submissions since the last call.

        Submissions of other variables are taken back (``withdraw``): nobody waits for them.
        """
        taken, self._submitted = self._submitted, {}
        mine = {i: taken.pop(id(v)) for i, v in enumerate(variables) if id(v) in taken}
        if taken:
            withdraw(list(taken.values()), self._process_set)
        return mine
