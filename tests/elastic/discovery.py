"""A host discovery script for the tests: it prints the file ``hosts`` next to it."""

from pathlib import Path


def script(folder: Path, listing: str) -> str:
    """Return the path of a discovery script in ``folder`` that prints ``folder/hosts``.

    ``folder/hosts`` gets ``listing``: ``host:slots`` entries, split by commas or lines.
    """
    hosts = folder / "hosts"
    hosts.write_text(listing.replace(",", "\n") + "\n")
    path = folder / "discover.sh"
    path.write_text(f"#!/bin/sh\ncat {hosts}\n")
    path.chmod(0o755)
    return str(path)
