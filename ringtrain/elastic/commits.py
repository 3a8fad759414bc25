"""A state's commits between launches: one file per state, replaced whole at each commit."""

import os
import pickle
import socket


def _path(directory, key):
    return os.path.join(directory, f"{key}.commit")


def write(directory: str, key: str, number: int, snapshot) -> None:
    """Store commit ``number`` of state ``key``: a crash mid-write leaves the one before.

    Ranks of several hosts may write the same file of a shared directory: each writes its own
    temporary file first, and the last rename wins with the same content. A host where the
    directory does not exist yet (the launcher made it on its own host) makes it.
    """
    os.makedirs(directory, exist_ok=True)
    path = _path(directory, key)
    temporary = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        pickle.dump(number, file, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(snapshot, file, protocol=pickle.HIGHEST_PROTOCOL)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def number(directory: str, key: str) -> int:
    """Return the number of the commit of state ``key`` kept here, or -1 if there is none."""
    try:
        with open(_path(directory, key), "rb") as file:
            return pickle.load(file)
    except FileNotFoundError:
        return -1


def read(directory: str, key: str):
    """Return the snapshot of the commit of state ``key`` kept here."""
    with open(_path(directory, key), "rb") as file:
        pickle.load(file)  # its number
        return pickle.load(file)
