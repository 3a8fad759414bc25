"""The contract between ``ringtrain-run`` and the ranks it starts: names, signals, statuses.

Two sides import it. The launcher (``ringtrain.runner``) exports variables to every rank,
puts the guard in front of a Python command, reads the ranks' lines (started, failed,
peer unreachable) from mpirun's output, sends the notice signal, and reads the restart
status. The ranks (``ringtrain.guard``, ``ringtrain.settings``, ``ringtrain.elastic``, the
engine's watchdog) read those variables, announce their start, say which rank failed or
stopped answering, count the notices, and exit with the restart status. Neither side
imports the other; each says here what it expects of the other.
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
# A rank that fails (raises, or exits non-zero) says so on stderr before the job ends; the
# guard prints it. FAILED's group 1 is the rank.
_FAILED_LINE = "ringtrain-run: rank {} on host {} {}; ending the job"
FAILED = re.compile(rb"ringtrain-run: rank (\d+) on host \S+ .*; ending the job")
# A rank that finds a peer unreachable or frozen prints this line on stderr, once per peer,
# before it fails: the peer's rank in the job (``COMM_WORLD``), and its host for a reader.
# An elastic launcher leaves that rank's host out of the next launches (it maps the rank to
# the host it placed there: a host's own name need not be the one the launcher used), and
# relays everything but these lines. UNREACHABLE's group 1 is the peer's rank.
_UNREACHABLE_LINE = "@@ringtrain-run: rank {} on host {} stopped answering@@"
UNREACHABLE = re.compile(rb"@@ringtrain-run: rank (\d+) on host \S+ stopped answering@@")

# Elastic launches: the launcher sends mpirun NOTICE_SIGNAL when the hosts change (mpirun
# passes it on to every rank); ranks that stop at a commit for it exit with RESTART_STATUS.
NOTICE_SIGNAL = signal.SIGUSR2
RESTART_STATUS = 75  # EX_TEMPFAIL: the ranks stopped at a commit, to be relaunched


def started_line(rank: int | str) -> str:
    """Return the line a guard prints once its rank has started (``STARTED`` matches it)."""
    return _STARTED_LINE.format(rank)


def failed_line(rank: int | str, host: str, what: str) -> str:
    """Return the line that says rank ``rank`` on ``host`` failed (``FAILED`` matches it)."""
    return _FAILED_LINE.format(rank, host, what)


def unreachable_line(rank: int, host: str) -> str:
    """Return the line that says a peer stopped answering (``UNREACHABLE`` matches it).

    ``rank``: the peer's rank in ``COMM_WORLD``; ``host``: the name of its host.
    """
    return _UNREACHABLE_LINE.format(rank, host)
