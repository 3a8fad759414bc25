"""How error messages name Keras variables, on every backend."""


def variable_label(variable, index: int) -> str:
    """Return how error messages name ``variable`` (a Keras or tf variable, or a tensor)."""
    for attribute in ("path", "name"):
        label = getattr(variable, attribute, None)
        if isinstance(label, str) and label:
            return label
    return f"#{index}"
