"""Autotune: rank 0 tries engine settings during the first steps and keeps the best.

- ``space``: the settings that can be tuned, their ranges, and which a job tunes.
- ``search``: the optimiser that proposes each sample (optuna's TPE sampler).
- ``steps``: steps found in the stream of allreduces, and each sample's score.
- ``confirm``: the search's best timed again against the starting settings.
- ``log``: the CSV of every sample (``RINGTRAIN_AUTOTUNE_LOG``).
- ``memory``: the best settings remembered per job (``RINGTRAIN_AUTOTUNE_CACHE``).
- ``tuner``: the whole run, from warm-up to the settings every rank switches to.

The rest of ringtrain's self-tuning stays where it acts, each rule on one rank's own
measurements, and needs no agreement across ranks (docs/how-it-works.md, "Autotune"):
the Waiter's spins (``transport.progress``), the message ring's sends in flight from the
link's rate (``transport.messages``), the spin of the turns (``engine.turns``). The chunk
trial across hosts (``transport.link_chunk``) is the one that ranks agree on; where the
tuner tunes the ring chunk, it takes the trial's place.
"""
