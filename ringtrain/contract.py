"""The contract between ``ringtrain-run`` and the ranks it starts: names, signals, statuses.

Two sides import it. The launcher (``ringtrain.runner``) exports variables to every rank,
puts the guard in front of a Python command, reads the guard's start lines from mpirun's
output, sends the notice signal, and reads the restart status. The ranks (``ringtrain.guard``,
``ringtrain.settings``, ``ringtrain.elastic``) read those variables, announce their start,
count the notices, and exit with the restart status. Neither side imports the other; each
says here what it expects of the other.
"""

import re
import signal

# The environment that the launcher gives every rank.
PREFIX = "RINGTRAIN_"  # every variable of this prefix is a setting (``ringtrain.settings``)
ELASTIC_DIR = PREFIX + "ELASTIC_DIR"  # an elastic launch's directory of commits
ELASTIC_GENERATION = PREFIX + "ELASTIC_GENERATION"  # how many launches came before this one
# Where the guard finds its rank before MPI starts: the mpirun that the launcher runs sets
# one of these (Open MPI; MPICH's Hydra).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")

# The guard: each Python rank runs ``python -m GUARD_MODULE [ANNOUNCE] script.py ...``.
GUARD_MODULE = "ringtrain.guard"
ANNOUNCE = "--announce"  # print the started line first
_STARTED_LINE = "@@ringtrain-run: rank {} started@@"
STARTED = re.compile(re.escape(_STARTED_LINE).replace(r"\{\}", r"(\d+)").encode())

# Elastic launches: the launcher sends mpirun NOTICE_SIGNAL when the hosts change (mpirun
# passes it on to every rank); ranks that stop at a commit for it exit with RESTART_STATUS.
NOTICE_SIGNAL = signal.SIGUSR2
RESTART_STATUS = 75  # EX_TEMPFAIL: the ranks stopped at a commit, to be relaunched


def started_line(rank: int | str) -> str:
    """Return the line a guard prints once its rank has started (``STARTED`` matches it)."""
    return _STARTED_LINE.format(rank)
