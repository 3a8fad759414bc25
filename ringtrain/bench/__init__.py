"""ringtrain's benchmarks: ``python -m ringtrain.bench <name>`` under mpirun.

- ``allreduce``: ringtrain's allreduce against ``MPI_Allreduce``; ``kernels``: the fusion
  kernels against a plain copy (no MPI).
- ``cluster`` (root, not under mpirun): ``allreduce`` across test hosts made of network
  namespaces (``netns``) with capped links, against the link's rate and TCP ceiling.
- ``compare`` (not under mpirun): checkouts of ringtrain timed in turns, batch by batch, as
  ratios: for a change's before and after on a machine whose speed drifts.
- ``train``: training throughput against one process and MultiWorkerMirroredStrategy;
  ``thread_cpu``: where a step's CPU goes, by thread.
"""
