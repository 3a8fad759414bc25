"""The autotune log: a CSV with a row per sample and a last row for the best, as Horovod's."""

import csv

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
        """Write one row: the sample's number (or ``best``), every setting, the score."""
        self._writer.writerow([number, *(values[f] for f in FIELDS), f"{score:.6g}"])
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()
