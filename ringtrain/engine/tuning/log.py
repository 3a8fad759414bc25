"""The autotune log: a CSV with a row per sample and a last row for the best, as Horovod's."""

import csv
import warnings

from ringtrain.engine.tuning.space import FIELDS

COLUMNS = ("sample", *FIELDS, "score_bytes_per_second")


class TuningLog:
    """Writes rows to the CSV at ``path`` as samples end, flushed, so a crash keeps them."""

    def __init__(self, path: str):
        self._file = open(path, "w", newline="")  # noqa: SIM115 - open while the tuner runs
        self._writer = csv.writer(self._file)
        self._writer.writerow(COLUMNS)
        self._file.flush()

    def sample(self, number, values: dict, score: float) -> None:
        """Write one row: the sample's number (or ``best``), every setting, the score.

        A failed write (a full disk) is warned about once, and the log stops there.
        """
        if self._file.closed:
            return
        try:
            self._writer.writerow([number, *(values[f] for f in FIELDS), f"{score:.6g}"])
            self._file.flush()
        except OSError as err:
            warnings.warn(f"the autotune log stops here: {err}", stacklevel=2)
            self.close()

    def close(self) -> None:
        """Close the file (again: nothing)."""
        try:
            self._file.close()
        except OSError:
            pass  # its last rows were flushed or warned about
