"""The launcher: turns hosts and flags into an ``mpirun`` argv list, and runs the job.

Only the ``ringtrain-run`` process runs this package; it meets the ranks it starts only in
``ringtrain.contract`` (and the settings it exports to them, ``ringtrain.settings``).
"""
