"""Exceptions that ringtrain raises to its users."""


class RingtrainError(RuntimeError):
    """Base class of every error raised by ringtrain."""


class NotInitializedError(RingtrainError):
    """A ringtrain call was made before ``init()`` or after ``shutdown()``."""


class MismatchError(RingtrainError):
    """Ranks submitted the same tensor name with different shape, dtype, op or other fields."""


class DuplicateNameError(RingtrainError, ValueError):
    """A tensor name was submitted again while its first submission is still in flight."""


class StallError(RingtrainError):
    """A tensor some ranks submitted and others did not, past the stall shutdown time (or late)."""


class EngineStoppedError(RingtrainError):
    """The background engine has stopped, so no further collective can complete."""


class CollectiveTimeoutError(RingtrainError):
    """A peer made no progress in a collective for ``RINGTRAIN_COLLECTIVE_TIMEOUT`` seconds.

    ``peers`` lists the (``MPI_COMM_WORLD`` rank, host name) of each rank waited for.
    ``reported_by`` is None when this rank found the peers lost itself, or the (rank, host)
    of the rank that found a peer lost and told this one, which then gave up its own wait.
    """

    def __init__(self, message: str, peers=(), reported_by: tuple[int, str] | None = None):
        super().__init__(message)
        self.peers = tuple(peers)
        self.reported_by = reported_by
