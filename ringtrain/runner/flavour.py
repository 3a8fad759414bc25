"""Tell which MPI an ``mpirun`` belongs to from what ``mpirun --version`` prints."""

import enum
import re
import subprocess

from ringtrain.runner.job import LaunchError

_OPENMPI_VERSION = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+)\.(\d+)")


class Flavour(enum.Enum):
    """The launcher families that ringtrain-run builds an argv for."""

    OPENMPI = "Open MPI"
    HYDRA = "MPICH/Hydra"


def parse_version(text: str) -> Flavour:
    """Return the flavour that ``mpirun --version`` output ``text`` names; Open MPI must be 5+."""
    if "Open MPI" in text or "OpenRTE" in text:
        match = _OPENMPI_VERSION.search(text)
        if match is None or int(match[1]) < 5:
            found = match[0] if match else _first_line(text)
            raise LaunchError(f"ringtrain-run needs Open MPI 5 or later; this mpirun is {found}")
        return Flavour.OPENMPI
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return Flavour.HYDRA
    raise LaunchError(
        f"cannot tell which MPI this mpirun is from its --version output: {_first_line(text)!r}"
    )


def detect(mpirun: str, timeout: float = 30.0) -> Flavour:
    """Run ``mpirun --version`` and return its flavour."""
    try:
        done = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{mpirun} --version did not answer within {timeout:g} s") from None
    return parse_version(done.stdout + done.stderr)


def _first_line(text):
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
