"""Requests and their handles: what a submission holds, and the future it returns."""

import threading


class Handle:
    """The future result of one submitted collective.

    Completion releases a lock taken at creation: far cheaper than an Event on the
    per-tensor path, and waiters still block without spinning.
    """

    __slots__ = ("name", "_pending", "_done", "_result", "_error", "_give_back")

    def __init__(self, name: str):
        self.name = name
        self._pending = threading.Lock()
        self._pending.acquire()
        self._done = False
        self._result = None
        self._error = None
        self._give_back = None

    def give_back_as(self, give_back) -> None:
        """Have ``wait`` return ``give_back(result)``: the result as the caller's kind of array."""
        self._give_back = give_back

    def done(self) -> bool:
        """Return True once the result (or error) is in."""
        return self._done

    def wait(self):
        """Block until done; return the result or raise the error."""
        if not self._done:
            # Short timeouts keep Ctrl-C working while a collective waits for other ranks.
            while not self._pending.acquire(timeout=0.5):
                pass
            self._pending.release()
        if self._error is not None:
            raise self._error
        if self._give_back is not None:
            return self._give_back(self._result)
        return self._result

    def fail(self, error: BaseException) -> None:
        """Set the error (engine thread only)."""
        self._error = error
        self._finish()

    def _finish(self):
        self._done = True
        self._pending.release()


def complete_all(handles, results) -> None:
    """Set the result of each of ``handles`` (engine thread only); None handles are skipped.

    Every result is set before any waiter is released: a caller woken by the first handle
    finds the others done and takes them without blocking again. Completed one at a time,
    each release woke the caller, which took the GIL from the engine thread and blocked on
    the next handle, handing it back: a switch of threads per tensor of a fused response.
    """
    done = []
    for handle, result in zip(handles, results, strict=True):
        if handle is not None:
            handle._result = result
            handle._done = True
            done.append(handle._pending)
    for pending in done:
        pending.release()


class GroupHandle:
    """One handle over several collectives: done once all are; its result is their list."""

    __slots__ = ("members",)

    def __init__(self, members):
        self.members = list(members)

    def done(self) -> bool:
        """Return True once every member is done."""
        return all(h.done() for h in self.members)

    def wait(self):
        """Block until every member is done; return their results in order (or raise)."""
        return [h.wait() for h in self.members]


class Request:
    """One local submission: its meta, its data, where the result goes, and its handle.

    ``read_only``: the caller never writes to the result, which may then be a read-only
    array that the ranks of a host share.
    """

    __slots__ = ("meta", "array", "out", "read_only", "handle", "submitted_ns", "sent_ns")

    def __init__(self, meta, array, out, submitted_ns: int, read_only: bool = False):
        self.meta = meta
        self.array = array
        self.out = out
        self.read_only = read_only
        self.handle = Handle(meta.name)
        self.submitted_ns = submitted_ns
        self.sent_ns = submitted_ns  # when the engine thread passed it to the coordinator
