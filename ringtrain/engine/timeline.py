"""A Chrome-trace timeline (opens in Perfetto) that is valid JSON after every write."""

import json
import threading
import time

ENQUEUE = "ENQUEUE"
NEGOTIATE = "NEGOTIATE"
WAIT_FOR_OTHER_RANKS = "WAIT_FOR_OTHER_RANKS"
MEMCPY_IN_FUSION_BUFFER = "MEMCPY_IN_FUSION_BUFFER"
REDUCE_SCATTER = "REDUCE_SCATTER"
ALLGATHER = "ALLGATHER"
MEMCPY_OUT_FUSION_BUFFER = "MEMCPY_OUT_FUSION_BUFFER"


# The clock every timeline timestamp is taken from, in nanoseconds: the function itself, not
# a wrapper, since every collective reads it several times whether a timeline runs or not.
now_ns = time.perf_counter_ns


class Timeline:
    """Writes one rank's events to ``path``, one track per tensor name, times in microseconds.

    The file always ends with the closing bracket of the event array: each write replaces
    it, so a reader (or a crash) at any moment finds valid JSON.
    """

    def __init__(self, path: str, rank: int):
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held until close()
        self._file.write("[\n]")
        self._file.flush()
        self._rank = rank
        self._origin = now_ns()
        self._tracks: dict[str, int] = {}
        self._first = True
        self._lock = threading.Lock()

    def span(self, name: str, phase: str, start_ns: int, end_ns: int, **args) -> None:
        """Record that tensor ``name`` spent [start_ns, end_ns) in ``phase``."""
        event = {"name": phase, "ph": "X", "ts": self._us(start_ns)}
        event["dur"] = max(0.0, (end_ns - start_ns) / 1000)
        self._emit(name, event, args)

    def instant(self, name: str, phase: str, at_ns: int, **args) -> None:
        """Record that ``phase`` happened to tensor ``name`` at ``at_ns``."""
        self._emit(name, {"name": phase, "ph": "i", "s": "t", "ts": self._us(at_ns)}, args)

    def close(self) -> None:
        """Flush and close the file; later events are dropped."""
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def _us(self, t_ns):
        return (t_ns - self._origin) / 1000

    def _emit(self, name, event, args):
        with self._lock:
            if self._file.closed:
                return
            events = []
            track = self._tracks.get(name)
            if track is None:
                track = self._tracks[name] = len(self._tracks) + 1
                events.append(
                    {
                        "name": "thread_name",
                        "ph": "M",
                        "pid": self._rank,
                        "tid": track,
                        "args": {"name": name},
                    }
                )
            event.update(pid=self._rank, tid=track)
            if args:
                event["args"] = args
            events.append(event)
            text = ",\n".join(json.dumps(e) for e in events)
            self._file.seek(self._file.tell() - 1)
            self._file.write(("" if self._first else ",\n") + text + "\n]")
            self._file.flush()
            self._first = False
