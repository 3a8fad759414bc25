"""Requests and their handles: what a submission holds, and the future it returns."""

import threading


class Handle:
    """The future result of one submitted collective."""

    __slots__ = ("name", "_event", "_result", "_error")

    def __init__(self, name: str):
        self.name = name
        self._event = threading.Event()
        self._result = None
        self._error = None

    def done(self) -> bool:
        """Return True once the result (or error) is in."""
        return self._event.is_set()

    def wait(self):
        """Block until done; return the result or raise the error."""
        while not self._event.wait(0.5):
            pass
        if self._error is not None:
            raise self._error
        return self._result

    def complete(self, result) -> None:
        """Set the result (engine thread only)."""
        self._result = result
        self._event.set()

    def fail(self, error: BaseException) -> None:
        """Set the error (engine thread only)."""
        self._error = error
        self._event.set()


class Request:
    """One local submission: its meta, its data, where the result goes, and its handle."""

    __slots__ = ("meta", "array", "out", "handle", "submitted_ns")

    def __init__(self, meta, array, out, submitted_ns: int):
        self.meta = meta
        self.array = array
        self.out = out
        self.handle = Handle(meta.name)
        self.submitted_ns = submitted_ns
