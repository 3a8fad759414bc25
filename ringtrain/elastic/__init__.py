"""Elastic training in Horovod's shape: states that ranks commit, and ``run``, which resumes them.

Launched by ``ringtrain-run --host-discovery-script``, a job is relaunched when a rank fails
or the hosts change (``ringtrain.runner.elastic``); ``run`` then resumes its state from the
newest commit that any rank kept. Launched otherwise, commits stay in memory, as in Horovod.

- ``state``: ``State`` and ``ObjectState``; ``commits``: their commits between launches.
- ``resume``: ``run``; ``notices``: the rank's count of the launcher's notices of new hosts.
"""

from ringtrain.elastic.resume import run
from ringtrain.elastic.state import HostsUpdatedInterrupt, ObjectState, State

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "State", "run"]
