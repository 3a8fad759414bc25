"""``run``: start a training function from the state that the ranks agree on, and resume it."""

import functools

from ringtrain import api, contract
from ringtrain.elastic.state import HostsUpdatedInterrupt


def run(func):
    """Wrap ``func(state, ...)`` as Horovod's ``hvd.elastic.run`` does (a decorator).

    The wrapper first resumes ``state`` from the newest commit that any rank kept (in a
    relaunch of an elastic job), gives every rank the same values (``state.sync()``), and,
    in a relaunch, runs the state's reset callbacks. When a commit raises
    ``HostsUpdatedInterrupt``, it keeps the state as it is, shuts ringtrain down and exits
    with the status that makes ``ringtrain-run`` relaunch the job on the new hosts.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        launch = state._launch
        if launch.directory is not None:
            state._resume()
        state.sync()
        if launch.generation > 0:
            state.on_reset()
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            state.save()  # as the ranks have it: Horovod too goes on without a restore
            state._keep()
            api.shutdown()
            raise SystemExit(contract.RESTART_STATUS) from None

    return wrapper
