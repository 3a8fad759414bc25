"""start_timeline/stop_timeline while the engine runs; the test reads the files back.

Argument: a folder. Only the calls between start and stop are recorded; a second start
while one runs fails clearly; a new timeline can start after a stop, also per rank.
"""

import json
import os
import sys

import numpy as np
from common import main

import ringtrain


def _tracks(path):
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    return {e["args"]["name"] for e in events if e["ph"] == "M"}


def body():
    folder = sys.argv[1]
    ringtrain.init()
    r = ringtrain.rank()
    ringtrain.allreduce(np.ones(10, np.float32), name="before")
    try:  # a folder that is not there: the error names it, and nothing is left started
        ringtrain.start_timeline(os.path.join(folder, "missing", "t{rank}.json"))
    except OSError as err:
        assert "missing" in str(err), err
    else:
        raise AssertionError("start_timeline into a missing folder did not fail")
    first = os.path.join(folder, "first.json")
    ringtrain.start_timeline(first)
    for bad, expected in ((first, "already being written"), ("", "needs a file path")):
        try:
            ringtrain.start_timeline(bad)
        except ValueError as err:
            assert expected in str(err), err
        else:
            raise AssertionError(f"start_timeline({bad!r}) while one runs did not fail")
    ringtrain.allreduce(np.ones(10, np.float32), name="traced")
    ringtrain.allgather(np.ones((r + 1, 2)), name="gathered")
    ringtrain.stop_timeline()
    ringtrain.stop_timeline()  # a second stop does nothing
    ringtrain.allreduce(np.ones(10, np.float32), name="after")
    ringtrain.start_timeline(os.path.join(folder, "second-{rank}.json"))
    ringtrain.allreduce(np.ones(3, np.float32), name="again")
    ringtrain.barrier()  # every rank's "again" is recorded before rank 0 reads the files
    ringtrain.stop_timeline()
    ringtrain.barrier()
    if r == 0:
        assert _tracks(first) == {"traced", "gathered"}, _tracks(first)
    for q in range(ringtrain.size()):
        assert "again" in _tracks(os.path.join(folder, f"second-{q}.json"))
    try:
        ringtrain.start_timeline(first, mark_cycles=True)
    except ValueError as err:
        assert "mark_cycles" in str(err), err
    else:
        raise AssertionError("mark_cycles=True did not fail")
    ringtrain.shutdown()


main(body)
