"""The best settings remembered per job, in a small JSON file (``RINGTRAIN_AUTOTUNE_CACHE``).

A job is keyed by its model's signature (``steps.signature``), its world size, its ranks per
host, and the link rate measured across hosts, to the nearest power of ten of Gbit/s, coarse
so that one link's rate, measured a little differently at each launch, keeps one key. A
key that differs only means that the job is tuned again. A file
that is not valid, or not ringtrain's, is warned about and ignored, never trusted; it is not
written over either, so nothing of the user's is lost. Writes replace the file whole.
"""

import collections
import json
import math
import os
import tempfile
import warnings

from ringtrain.engine.tuning import space

FORMAT = "ringtrain-autotune"
VERSION = 1


def job_key(model: str, topology, link_bytes_per_s: float | None) -> dict:
    """Return the key of a job: ``model`` signature, ranks, hosts, and the link's rate class.

    ``link_bytes_per_s``: the rate measured across hosts (None on one host, or unmeasured).
    """
    per_host = collections.Counter(topology.hosts)
    link = None
    if link_bytes_per_s:
        link = 10.0 ** round(math.log10(link_bytes_per_s * 8 / 1e9))
    return {
        "model": model,
        "size": topology.size,
        "ranks_per_host": sorted(per_host.values()),
        "link_gbit_per_s": link,
    }


class TuningMemory:
    """The remembered settings in the file at ``path`` (which need not exist yet)."""

    def __init__(self, path: str):
        self.path = path
        self._entries, self._writable = self._read()

    def _read(self) -> tuple[list, bool]:
        """Return the file's valid entries and whether it may be written; warn of the rest."""
        if not os.path.exists(self.path):
            return [], True
        try:
            with open(self.path) as file:
                data = json.load(file)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return self._foreign(f"it cannot be read as JSON ({err})")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return self._foreign(f'it is not a {FORMAT} file (no "format": "{FORMAT}")')
        if data.get("version") != VERSION or not isinstance(data.get("jobs"), list):
            return self._foreign(f"expected version {VERSION} with a list of jobs")
        entries = []
        for number, entry in enumerate(data["jobs"]):
            try:
                if not isinstance(entry, dict) or not isinstance(entry.get("key"), dict):
                    raise ValueError("expected an object with a key and settings")
                values = space.checked(entry.get("settings"), space.FIELDS)
                entries.append((entry["key"], values, entry.get("score_bytes_per_second")))
            except ValueError as err:
                warnings.warn(
                    f"ignoring job {number} of the autotune cache {self.path}: {err}",
                    stacklevel=2,
                )
        return entries, True

    def _foreign(self, why):
        warnings.warn(
            f"ignoring the autotune cache {self.path}: {why}; it will not be written over",
            stacklevel=3,
        )
        return [], False

    def recall(self, key: dict) -> dict | None:
        """Return the settings remembered for ``key``, or None."""
        for entry_key, values, _ in self._entries:
            if entry_key == key:
                return dict(values)
        return None

    def remember(self, key: dict, values: dict, score: float) -> None:
        """Store ``values`` for ``key`` (replacing an older entry) and write the file."""
        if not self._writable:
            warnings.warn(
                f"the autotune cache {self.path} is not ringtrain's: the tuned settings are "
                "not remembered",
                stacklevel=2,
            )
            return
        self._entries = [entry for entry in self._entries if entry[0] != key]
        self._entries.append((key, {f: values[f] for f in space.FIELDS}, score))
        jobs = [{"key": k, "settings": v, "score_bytes_per_second": s} for k, v, s in self._entries]
        data = {"format": FORMAT, "version": VERSION, "jobs": jobs}
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".autotune-")
        except OSError as err:
            warnings.warn(f"the tuned settings are not remembered: {err}", stacklevel=2)
            return
        try:
            with os.fdopen(handle, "w") as file:
                json.dump(data, file, indent=1)
            os.replace(temporary, self.path)
        except OSError as err:
            os.unlink(temporary)
            warnings.warn(f"the tuned settings are not remembered: {err}", stacklevel=2)
