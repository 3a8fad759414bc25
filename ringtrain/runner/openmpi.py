"""Build the Open MPI 5 ``mpirun`` argv for a Job."""

from ringtrain.runner.job import Job


def build_argv(mpirun: str, job: Job) -> list[str]:
    """Return the ``mpirun`` argv that runs ``job`` under Open MPI 5 (PRRTE).

    Ranks are placed by slot and not bound to cores, output lines are tagged with
    ``[job,rank]``, root is allowed, and every ``RINGTRAIN_*`` setting goes to every rank
    with ``-x NAME=VALUE``. A job without hosts runs on this machine and may oversubscribe
    it: Open MPI then oversubscribes (and yields when idle) only if ``-np`` exceeds the cores
    it counts.
    """
    oversubscribe = job.oversubscribe or job.hosts is None
    argv = [mpirun, "-np", str(job.num_proc), "--allow-run-as-root", "--bind-to", "none"]
    argv += ["--map-by", "slot:OVERSUBSCRIBE" if oversubscribe else "slot", "--output", "tag"]
    if job.hosts is not None:
        argv += ["--host", ",".join(f"{host.name}:{host.slots}" for host in job.hosts)]
    if job.network_interface is not None:
        nics = job.network_interface
        argv += ["--mca", "btl_tcp_if_include", nics, "--prtemca", "oob_tcp_if_include", nics]
    for name, value in job.env:
        argv += ["-x", f"{name}={value}"]
    return argv + list(job.mpi_args) + list(job.command)
