"""Build the MPICH/Hydra ``mpiexec`` argv for a Job."""

from ringtrain.runner.job import Job, LaunchError


def build_argv(mpiexec: str, job: Job) -> list[str]:
    """Return the Hydra argv that runs ``job``.

    Hydra fills each ``host:N`` entry in turn (placement by slot), binds nothing with
    ``-bind-to none``, prefixes output with the rank, and sets every ``RINGTRAIN_*``
    setting on every rank with ``-genv``. It neither refuses root nor limits ranks per host.
    """
    argv = [mpiexec, "-n", str(job.num_proc), "-bind-to", "none", "-prepend-rank"]
    if job.hosts is not None:
        argv += ["-hosts", ",".join(f"{host.name}:{host.slots}" for host in job.hosts)]
    if job.network_interface is not None:
        if "," in job.network_interface or "/" in job.network_interface:
            raise LaunchError(
                "MPICH/Hydra takes a single interface name for --network-interface, "
                f"not {job.network_interface!r}"
            )
        argv += ["-iface", job.network_interface]
    for name, value in job.env:
        argv += ["-genv", name, value]
    return argv + list(job.mpi_args) + list(job.command)
