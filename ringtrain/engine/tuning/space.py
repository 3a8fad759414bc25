"""The settings that autotune can change, their ranges, and the ones a job tunes."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One tunable setting: its ``Settings`` field and the values it may take.

    ``choices`` lists them in order (an ordered range for the optimiser, or two booleans).
    """

    field: str
    choices: tuple

    def index(self, value) -> int:
        """Return the position of ``value`` in ``choices``; ValueError if it is not one."""
        return self.choices.index(value)


def _powers_of_two(low: int, high: int) -> tuple:
    return tuple(1 << exponent for exponent in range(low, high + 1))


# Fusion threshold: 64 KiB to 128 MiB. Cycle time: the engine's sleep while it waits for
# other ranks is the cycle time or 0.1 ms, the shorter, so values from 0.1 ms act alike.
# Ring chunk: 64 KiB to 4 MiB (Open MPI's eager limit is raised to hold the largest).
# Hierarchical allreduce and the response cache: off or on.
PARAMETERS = (
    Parameter("fusion_threshold", _powers_of_two(16, 27)),
    Parameter("cycle_time_ms", (0.01, 0.02, 0.05, 0.1, 1.0)),
    Parameter("ring_chunk_bytes", _powers_of_two(16, 22)),
    Parameter("hierarchical_allreduce", (False, True)),
    Parameter("response_cache", (False, True)),
)
FIELDS = tuple(p.field for p in PARAMETERS)
BY_FIELD = {p.field: p for p in PARAMETERS}


def largest_chunk(settings) -> int:
    """Return the largest ring chunk a job of ``settings`` may cut: the tuner's, where it tunes."""
    if settings.autotune and "ring_chunk_bytes" not in settings.user_set:
        return max(settings.ring_chunk_bytes, BY_FIELD["ring_chunk_bytes"].choices[-1])
    return settings.ring_chunk_bytes


def current(settings, hierarchical: bool) -> dict:
    """Return the tunable settings' values in ``settings``; ``hierarchical`` as decided."""
    return {
        "fusion_threshold": settings.fusion_threshold,
        "cycle_time_ms": settings.cycle_time_ms,
        "ring_chunk_bytes": settings.ring_chunk_bytes,
        "hierarchical_allreduce": hierarchical,
        "response_cache": settings.cache_capacity > 0,
    }


def tuned_fields(user_set, hierarchical_possible: bool) -> tuple:
    """Return the fields a job tunes: all but those the user set and those it cannot switch.

    The response cache is the user's where ``cache_capacity`` was set; hierarchical where
    the job cannot run both ways (one host, or one rank per host).
    """
    given = set(user_set)
    if "cache_capacity" in given:
        given.add("response_cache")
    if not hierarchical_possible:
        given.add("hierarchical_allreduce")
    return tuple(field for field in FIELDS if field not in given)


def checked(values, fields) -> dict:
    """Return ``values`` of ``fields`` if each is one of its parameter's choices, else raise.

    For settings read back from a file: ValueError names the first value that is wrong.
    """
    if not isinstance(values, dict):
        raise ValueError(f"expected a mapping of settings, got {type(values).__name__}")
    out = {}
    for field in fields:
        if field not in values:
            raise ValueError(f"no value for {field}")
        parameter, value = BY_FIELD[field], values[field]
        if type(value) is not type(parameter.choices[0]) or value not in parameter.choices:
            raise ValueError(f"{field}={value!r} is not one of {list(parameter.choices)}")
        out[field] = value
    return out
