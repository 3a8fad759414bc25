"""The command each rank runs: the user's, with the rank guard (``ringtrain.guard``) in front."""

import os
import re

from ringtrain import contract

_GUARD = ["-m", contract.GUARD_MODULE]
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_FLAGS = re.compile(r"-[bBdEiIOPqsSuvx]+|-[WX].+")  # interpreter options that stand alone


def guarded(command: list[str], announce: bool = False) -> list[str]:
    """Return ``command`` with the guard put in front of its script, if it is a Python command.

    ``python [options] script.py args``, ``python [options] -m module args`` and
    ``python [options] -c code args`` are guarded; anything else is returned unchanged.
    With ``announce``, each rank prints a line that ``contract.STARTED`` matches before the
    script runs.
    """
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return list(command)
    index = 1
    while index < len(command):
        arg = command[index]
        if arg in ("-m", "-c") or not arg.startswith("-"):
            guard = [*_GUARD, contract.ANNOUNCE] if announce else _GUARD
            return command[:index] + guard + command[index:]
        if arg in ("-W", "-X"):
            index += 2
        elif _FLAGS.fullmatch(arg):
            index += 1
        else:
            break
    return list(command)
