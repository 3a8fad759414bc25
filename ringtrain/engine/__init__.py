"""The engine: runs a communicator's collectives on a background thread, matched by name.

- ``core.Engine``: submissions and their handles (``handle``), and the turn that sends them
  to the coordinator, takes its responses and runs them; no MPI of its own.
- ``turns``: who takes the turns (the engine thread or a blocked caller), with its invariants.
- ``negotiation``: rank 0's coordinator (pure), fusing with ``fusion``; ``messages``: what
  ranks and coordinator tell each other; ``stall``: names some ranks submitted and others not.
- ``planner`` (pure): a response into a plan; ``executor``: carries plans out through the
  transport (``ringtrain.transport``); ``results``: result memory, read-only sharing included.
- ``liveness``: heartbeats on the control channel, and the check that fails a collective
  whose peer has fallen silent.
- ``timeline``: the Chrome-trace timeline.
"""
