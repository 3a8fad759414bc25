"""The launcher: turns hosts and flags into an ``mpirun`` argv list, and runs the job.

Only the ``ringtrain-run`` process runs this package; it meets the ranks it starts only in
``ringtrain.contract`` (and the settings it exports to them, ``ringtrain.settings``).

- ``cli``: ``ringtrain-run``'s command line; ``job``: the record of one launch.
- ``hosts``: hostfiles and ``-H`` lists; ``exports``: tuning options as ``RINGTRAIN_*``.
- ``locate`` finds ``mpirun``, ``flavour`` tells which MPI it is, and ``openmpi`` or
  ``hydra`` builds its argv; ``rank_command`` puts the rank guard in front of the command.
- ``watchdog``: relays mpirun's output and ends a job whose ranks do not start in time.
- ``elastic``: relaunches an elastic job when a rank fails or the hosts change.
"""
