"""ringtrain's benchmarks: ``python -m ringtrain.bench <name>`` under mpirun."""
