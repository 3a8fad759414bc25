"""The launcher: turns hosts and flags into an ``mpirun`` argv list."""
