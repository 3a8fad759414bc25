"""What an elastic job commits: Horovod's ``State`` and ``ObjectState``, kept across launches."""

import copy
import itertools

import numpy as np

from ringtrain import api, settings
from ringtrain.elastic import commits, notices
from ringtrain.ops import Max

_keys = itertools.count()


class HostsUpdatedInterrupt(RuntimeError):  # noqa: N818 - Horovod's name
    """Raised on every rank at the same commit once the launcher has said the hosts changed."""


class State:
    """Values that the ranks commit together, restore, and agree on (Horovod's ``State``).

    ``bcast_object(obj)`` sends rank 0's ``obj`` to every rank (default
    ``ringtrain.broadcast_object``); ``get_rank()`` returns this rank (default
    ``ringtrain.rank``). Subclasses say what ``save``, ``restore`` and ``sync`` do, and what a
    commit keeps between launches (``_snapshot``, ``_adopt``).
    """

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or api.broadcast_object
        self._rank = get_rank or api.rank
        self._reset_callbacks = []
        self._launch = settings.elastic_launch()
        self._key = f"state{next(_keys)}"  # the same on every rank: states are made in order
        self._commits = 0
        self._notices = 0

    def register_reset_callbacks(self, callbacks) -> None:
        """Call each of ``callbacks`` (no arguments) after the job was relaunched.

        For instance to scale the learning rate with the new number of ranks.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks, in the order they were registered."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state, keep it for a relaunch, then check for new hosts (collective).

        Every rank commits at the same point. In an elastic launch each host's first rank
        writes the commit to the launch's directory, and every rank raises
        ``HostsUpdatedInterrupt`` here if the hosts have changed. Commit less often than
        every step where the state is large: each commit copies it.
        """
        self.save()
        self._keep()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if any rank has a new notice.

        Collective in an elastic launch (one small allreduce); does nothing outside one.
        """
        if self._launch.directory is None:
            return
        count = np.array([notices.counter().received], np.int64)
        newest = int(api.allreduce(count, op=Max, name=f"elastic.{self._key}.notices")[0])
        if newest > self._notices:
            self._notices = newest
            raise HostsUpdatedInterrupt("the launcher found new hosts; the job relaunches on them")

    def save(self) -> None:
        """Make the current values the committed ones."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the committed values."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank rank 0's committed values (collective)."""
        raise NotImplementedError

    def _snapshot(self):
        """Return the committed values as one picklable object."""
        raise NotImplementedError

    def _adopt(self, snapshot) -> None:
        """Make ``snapshot`` (from ``_snapshot``) the committed values, and restore them."""
        raise NotImplementedError

    def _keep(self) -> None:
        """Count a commit, and write it to the launch's directory on each host's first rank."""
        self._commits += 1
        if self._launch.directory is not None and api.local_rank() == 0:
            commits.write(self._launch.directory, self._key, self._commits, self._snapshot())

    def _resume(self) -> None:
        """Adopt the newest commit that any rank kept in the launch's directory (collective).

        Nothing changes where no rank kept one.
        """
        directory = self._launch.directory
        numbers = api.allgather_object(commits.number(directory, self._key))
        newest = max(numbers)
        if newest < 0:
            return
        holder = numbers.index(newest)
        snapshot = commits.read(directory, self._key) if self._rank() == holder else None
        self._adopt(api.broadcast_object(snapshot, root_rank=holder))
        self._commits = newest


class ObjectState(State):
    """Keyword values, each an attribute, committed as copies (Horovod's ``ObjectState``).

    ``ObjectState(epoch=0, batch=0)``; ``state.epoch += 1``; ``state.commit()``. The values
    must pickle.
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()

    def save(self) -> None:
        """Make copies of the attributes' current values the committed ones."""
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        """Set the attributes back to copies of the committed values."""
        self._set_attrs()

    def sync(self) -> None:
        """Give every rank rank 0's committed values, and set the attributes to them."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _snapshot(self):
        return self._saved_state

    def _adopt(self, snapshot) -> None:
        self._saved_state = snapshot
        self.restore()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
