"""Who runs the engine's turns: its own thread, or a blocking caller while it waits.

A turn sends this rank's new submissions, coordinates or takes responses, and runs them
(``Engine._turn_once``). The invariants:

1. One thread at a time runs a turn: whoever holds the turn lock.
2. The engine thread takes the lock whenever it is free; between turns it spins for
   ``SPIN_SECONDS`` (``LONE_SPIN_SECONDS`` on a rank alone on its host) after the last
   progress (yielding the CPU and the GIL), then sleeps until woken: while this rank waits
   for others, in sleeps that grow to ``BUSY_SLEEP_SECONDS``; while it is idle, for
   ``idle_seconds`` at a time (the heartbeat's interval). An idle engine that woke every
   millisecond let the kernel starve a rank that shared its core with another host's rank
   busy in an MPI call (docs/troubleshooting.md, ranks that share cores).
3. A caller blocked on its own handle (``wait``) takes the turns itself if the lock is free
   and the job has two ranks or more: that saves the hand-offs between threads, to the
   engine thread and back (about 15 us of a 60 us round trip). It gives them back after
   as long without progress, or once its handle is done, and wakes the engine thread if
   anything is still in flight or pending, so that nothing waits for a thread that sleeps.
4. A submission that does not wake the engine thread (``Engine.submit(wake=False)``) is
   always followed by ``wait`` on the same thread, which runs the turns or wakes the thread:
   ``BlockingCalls`` makes the blocking API calls submit that way, and only those.
5. A single rank leaves its turns to the engine thread: a Ctrl-C in the caller then stays a
   ``KeyboardInterrupt`` that the engine survives, rather than ending the job.
6. A failure inside a turn, in either thread, is handed to ``abort``, which ends the job:
   a rank lost halfway through a collective would hang the others.
"""

import os
import threading
import time

# For this long after its last progress a thread polls without sleeping, yielding the CPU and
# the GIL on each turn: training submits in bursts, and a timed sleep or a wake-up costs
# 25-130 us on a loaded machine, far more than a small message takes.
SPIN_SECONDS = 2e-3
# A rank alone on its host spins this long instead: between its turns it waits for peers
# across a link, for milliseconds, and spinning through that took the cores from the
# training beside it. 2 hosts x 1 rank (`bench train --hosts` workers), alternating pairs:
# the CNN's engine CPU a step went from 12.4-14.2 to 10.0-11.5 ms at 1 Gbit/s and from
# 12.9-13.0 to 9.9-10.3 at 10 Gbit/s, its samples/s up 3-7%; the MLP at 10 Gbit/s was level
# (4,529-4,823 against 4,197-4,727 samples/s, medians 4,688 and 4,684).
LONE_SPIN_SECONDS = 2e-4
# While this rank waits for others, its sleeps between turns grow to this at most.
BUSY_SLEEP_SECONDS = 100e-6
_FIRST_POLL = 20e-6  # seconds; the sleep grows from here while nothing happens


class Turns:
    """The turn lock, the engine thread and the wake-ups of one engine; see the module.

    ``turn()`` runs one turn and returns whether anything happened; ``stopped()`` says the
    engine has stopped for good; ``in_flight()`` that this rank waits for responses, and
    ``pending()`` that the coordinator waits for other ranks (either way the thread sleeps
    at most ``cycle_seconds`` or ``BUSY_SLEEP_SECONDS``, the shorter); ``abort(err, where)``
    ends the job after a failed turn. Turns spin ``spin`` seconds after progress
    (``SPIN_SECONDS`` or ``LONE_SPIN_SECONDS``); an idle engine thread sleeps
    ``idle_seconds`` at a time until woken.
    """

    def __init__(
        self,
        turn,
        stopped,
        in_flight,
        pending,
        abort,
        cycle_seconds,
        size,
        spin=SPIN_SECONDS,
        idle_seconds=1.0,
    ):
        self._turn = turn
        self._stopped = stopped
        self._in_flight = in_flight
        self._pending = pending
        self._abort = abort
        self._busy_sleep = min(cycle_seconds, BUSY_SLEEP_SECONDS)
        self._idle_sleep = idle_seconds
        self._callers_drive = size > 1
        self._spin = spin
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ringtrain-engine", daemon=True)

    def retune(self, cycle_seconds: float) -> None:
        """Sleep at most ``cycle_seconds`` (or ``BUSY_SLEEP_SECONDS``) from now on while waiting."""
        self._busy_sleep = min(cycle_seconds, BUSY_SLEEP_SECONDS)

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """Return the engine thread's id in the OS (``/proc/self/task/ID``), once started."""
        return self._thread.native_id

    def wake(self) -> None:
        """Wake the engine thread if it sleeps, so that it takes a turn soon."""
        if not self._wakeup.is_set():
            self._wakeup.set()

    def join(self) -> None:
        """Wake the engine thread and wait for it to end (once the engine has stopped)."""
        self._wakeup.set()
        self._thread.join()

    def wait(self, handle):
        """Return ``handle``'s result (or raise its error), running the turns while it waits.

        See invariants 3 and 5 of the module docstring.
        """
        if self._callers_drive and not handle.done() and self._lock.acquire(blocking=False):
            try:
                self._drive(handle)
            finally:
                self._lock.release()
            if self._in_flight() or self._pending():
                self._wakeup.set()
        elif not handle.done():
            self._wakeup.set()  # a submission made with wake=False waits for the engine thread
        return handle.wait()

    def _drive(self, handle):
        last_event = time.perf_counter()
        while not handle.done() and not self._stopped():
            try:
                progressed = self._turn()
            except BaseException as err:  # noqa: BLE001 - any failure mid-collective is fatal
                name = threading.current_thread().name
                self._abort(err, f"thread {name!r}, which waits for its call")
                return  # abort ends the job; nothing is left to drive
            if progressed:
                last_event = time.perf_counter()
            elif time.perf_counter() - last_event < self._spin:
                os.sched_yield()
            else:
                return

    def _main(self):
        try:
            self._loop()
        except BaseException as err:  # noqa: BLE001 - any failure mid-collective is fatal
            self._abort(err, "its own thread")

    def _loop(self):
        idle_sleep = self._idle_sleep
        sleep = _FIRST_POLL
        last_event = time.perf_counter()
        while not self._stopped():
            if not self._lock.acquire(blocking=False):
                # A waiting caller runs the turns; it wakes this thread when it stops.
                self._wakeup.wait(idle_sleep)
                self._wakeup.clear()
                continue
            try:
                progressed = not self._stopped() and self._turn()
            finally:
                self._lock.release()
            if progressed:
                sleep = _FIRST_POLL
                last_event = time.perf_counter()
                continue
            if time.perf_counter() - last_event < self._spin:
                os.sched_yield()  # releases the GIL; time.sleep(0) would cost ~70 us here
                continue
            if self._in_flight() or self._pending():
                sleep = min(sleep * 2, self._busy_sleep)
                self._wakeup.wait(sleep)
            else:
                self._wakeup.wait(idle_sleep)
            self._wakeup.clear()


class BlockingCalls(threading.local):
    """Each thread's blocking call in progress, so that its submission skips the wake-up.

    ``run(start, *args)`` calls ``start``, which submits one collective through ``submit``,
    then waits for its handle on the engine it went to (invariant 4 of the module).
    """

    active = False  # per thread: a blocking call is submitting
    engine = None  # per thread: the engine its submission went to

    def submit(self, engine, meta, array, out=None, read_only=False):
        """Queue one collective with ``engine``; return its handle."""
        blocking = self.active
        if blocking:
            self.engine = engine
        return engine.submit(meta, array, out, read_only, not blocking).handle

    def run(self, start, *args):
        """Call ``start(*args)``, which submits one collective, and wait for its handle."""
        self.active = True
        try:
            handle = start(*args)
        finally:
            self.active = False
        engine, self.engine = self.engine, None  # keep no stopped engine alive
        return engine.wait(handle)
