"""Transports: how tensor data moves between ranks, behind one seam.

- ``router.Transport`` is the seam: every collective the engine runs, each carried by the
  route that ``choice.choose`` (a pure rule) picks.
- ``messages``: MPI messages (the chunked, pipelined ring; MPI's allgather, broadcast and
  alltoall; Adasum's exchange in ``adasum``).
- ``shared``: the ring through a shared-memory file, for ranks of one host (``flags`` are
  its progress words; ``results`` the results its ranks share read-only).
- ``attach``: the ring that reads peers' buffers in place (``process_vm_readv``).
- ``hierarchical``: reduce within hosts, ring across them, broadcast within them.
- ``schedule``: the ring's pure schedule; ``local``: the route of a one-rank call.
- ``control``: the engine's control channel (submissions to rank 0, its responses, the abort).
- ``progress``: the one ``Waiter`` through which every wait for a peer polls, then sleeps,
  and fails after ``RINGTRAIN_COLLECTIVE_TIMEOUT`` without progress.
"""
