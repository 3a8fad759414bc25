"""Build the Open MPI 5 ``mpirun`` argv for a Job."""

from ringtrain.runner.job import Job

ABORT_DELAY_SECONDS = 2


def build_argv(mpirun: str, job: Job) -> list[str]:
    """Return the ``mpirun`` argv that runs ``job`` under Open MPI 5 (PRRTE).

    Ranks are placed by slot and not bound to cores (ringtrain's ``init()`` divides each
    host's cores among its ranks, see ``ringtrain.affinity``), output lines are tagged with
    ``[job,rank]``, root is allowed, aborting ranks wait ``ABORT_DELAY_SECONDS`` so that
    the rank that died first is the one reported, and every ``RINGTRAIN_*`` setting goes
    to every rank with ``-x NAME=VALUE``. A job without hosts runs on this machine and may
    oversubscribe it: Open MPI then oversubscribes (and yields when idle) only if ``-np``
    exceeds the cores it counts.
    """
    oversubscribe = job.oversubscribe or job.hosts is None
    argv = [mpirun, "-np", str(job.num_proc), "--allow-run-as-root", "--bind-to", "none"]
    argv += ["--map-by", "slot:OVERSUBSCRIBE" if oversubscribe else "slot", "--output", "tag"]
    # A rank that aborts waits before it exits: when a rank is killed, the peers that notice
    # the broken connection abort too, and without the wait Open MPI could report one of them
    # instead of the rank that died.
    argv += ["--mca", "opal_abort_delay", str(ABORT_DELAY_SECONDS)]
    if job.hosts is not None:
        argv += ["--host", ",".join(f"{host.name}:{host.slots}" for host in job.hosts)]
    if job.network_interface is not None:
        nics = job.network_interface
        argv += ["--mca", "btl_tcp_if_include", nics, "--prtemca", "oob_tcp_if_include", nics]
    for name, value in job.env:
        argv += ["-x", f"{name}={value}"]
    return argv + list(job.mpi_args) + list(job.command)
