"""ringtrain's benchmarks: ``python -m ringtrain.bench <name>`` under mpirun.

- ``allreduce``: ringtrain's allreduce against ``MPI_Allreduce``; ``kernels``: the fusion
  kernels against a plain copy (no MPI).
- ``train``: training throughput against one process and MultiWorkerMirroredStrategy;
  ``thread_cpu``: where a step's CPU goes, by thread.
"""
