"""``ringtrain-run``'s elastic mode: relaunch the job when a rank fails or the hosts change.

MPI can neither take new ranks into a running job nor lose one and go on, so an elastic job
is relaunched instead, and resumes from the last state its ranks committed
(``ringtrain.elastic``):

- Before each launch the host discovery script lists the hosts (``host:slots`` lines). The
  job gets a rank for each slot, at most ``max_np``; while there are fewer than ``min_np``
  slots it waits, up to ``timeout`` seconds.
- While the job runs, the launcher asks the script again every ``DISCOVERY_SECONDS``. Once
  the answer would launch the job differently, it notifies the ranks
  (``contract.NOTICE_SIGNAL``): they stop together at their next commit, and the launcher
  relaunches them on the new hosts.
- When the job fails (a rank crashed, a host went away), it is relaunched on the hosts found
  then, from its last commit. After ``reset_limit`` failures the launcher gives up and
  leaves the commits where they are.
- The host that failed it (a rank there stopped answering its peers, or failed on its own)
  is left out of the launches for ``blacklist_cooldown`` seconds, and for good once it
  failed ``blacklist_limit`` times (``ringtrain.runner.blacklist``); the relaunch goes on
  without it when the others hold ``min_np`` slots.

Each launch gets the commits' directory and its generation (0, 1, ...) in its environment
(``contract.ELASTIC_DIR``, ``contract.ELASTIC_GENERATION``).
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from ringtrain import contract
from ringtrain.runner import hosts, watchdog
from ringtrain.runner.blacklist import Blacklist, culprits
from ringtrain.runner.hosts import Host
from ringtrain.runner.job import LaunchError

DISCOVERY_SECONDS = 1.0  # how often a running job's hosts are discovered again
SCRIPT_SECONDS = 60.0  # how long one run of the discovery script may take


@dataclasses.dataclass(frozen=True)
class Elastic:
    """The elastic options of one ``ringtrain-run``; raises LaunchError on a bad one."""

    script: str
    min_np: int
    max_np: int
    slots_per_host: int = 1
    timeout: float = 600.0
    reset_limit: int = 3
    state_dir: str | None = None
    blacklist_cooldown: float = 60.0
    blacklist_limit: int = 2

    def __post_init__(self):
        if self.min_np < 1:
            raise LaunchError(f"--min-np must be at least 1, not {self.min_np}")
        if self.max_np < self.min_np:
            raise LaunchError(f"--max-np {self.max_np} is less than --min-np {self.min_np}")
        if self.slots_per_host < 1:
            raise LaunchError(f"--slots-per-host must be at least 1, not {self.slots_per_host}")
        if not self.timeout > 0:
            raise LaunchError(f"--elastic-timeout must be positive, not {self.timeout:g}")
        if self.reset_limit < 0:
            raise LaunchError(f"--reset-limit must be at least 0, not {self.reset_limit}")
        if not self.blacklist_cooldown >= 0:
            raise LaunchError(
                f"--blacklist-cooldown must be at least 0, not {self.blacklist_cooldown:g}"
            )
        if self.blacklist_limit < 1:
            raise LaunchError(f"--blacklist-limit must be at least 1, not {self.blacklist_limit}")

    def blacklist(self) -> Blacklist:
        """Return an empty blacklist with these options' cool-down and limit."""
        return Blacklist(self.blacklist_cooldown, self.blacklist_limit)


# (hosts, ranks) -> the launch command, given the variables that the ranks get on top
Launcher = Callable[[tuple[Host, ...], int, dict[str, str]], list[str]]


def discover(elastic: Elastic) -> list[Host]:
    """Run the host discovery script once; return the hosts it lists (maybe none)."""
    try:
        done = subprocess.run(
            [elastic.script], capture_output=True, text=True, timeout=SCRIPT_SECONDS, check=False
        )
    except OSError as err:
        raise LaunchError(
            f"cannot run the host discovery script {elastic.script!r}: {err}"
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"the host discovery script {elastic.script!r} did not finish within "
            f"{SCRIPT_SECONDS:g} s"
        ) from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        raise LaunchError(
            f"the host discovery script {elastic.script!r} exited with status "
            f"{done.returncode}: {said[0]}"
        )
    return hosts.parse_discovered(done.stdout, elastic.script, elastic.slots_per_host)


def placement(elastic: Elastic, found: list[Host]) -> tuple[tuple[Host, ...], int] | None:
    """Return the hosts (with the slots taken) and the ranks of a launch on ``found``.

    None when ``found`` holds fewer than ``min_np`` slots.
    """
    if sum(host.slots for host in found) < elastic.min_np:
        return None
    left = min(sum(host.slots for host in found), elastic.max_np)
    taken = []
    for host in found:
        if left == 0:
            break
        taken.append(Host(host.name, min(host.slots, left)))
        left -= taken[-1].slots
    return tuple(taken), sum(host.slots for host in taken)


def first_launch(elastic: Elastic, launcher: Launcher, directory: str) -> list[str]:
    """Return the command of generation 0 on the hosts discovered now (for ``--dry-run``)."""
    where = wait_for_placement(elastic, elastic.blacklist())
    return launcher(*where, _launch_env(directory, 0))


def run(elastic: Elastic, launcher: Launcher) -> int:
    """Run the job until it succeeds, is stopped, or has failed too often; return its status.

    A temporary directory for the commits (no ``state_dir``) is removed when the job
    succeeds, or when it holds nothing.
    """
    directory = elastic.state_dir or tempfile.mkdtemp(prefix="ringtrain-elastic-")
    os.makedirs(directory, exist_ok=True)
    status = None
    try:
        status = _relaunch(elastic, launcher, directory)
        return status
    except ValueError:  # no hosts to relaunch on: LaunchError, HostfileError
        if os.listdir(directory):
            _say(f"cannot relaunch; {_kept(directory)}")
        raise
    finally:
        if elastic.state_dir is None and (status == 0 or not os.listdir(directory)):
            shutil.rmtree(directory, ignore_errors=True)


def _relaunch(elastic, launcher, directory):
    generation, failures, blacklist = 0, 0, elastic.blacklist()
    while True:
        where = wait_for_placement(elastic, blacklist, patient=generation > 0)
        _say(f"generation {generation}: {where[1]} ranks on {_describe(where[0])}")
        argv = launcher(*where, _launch_env(directory, generation))
        status, stopped, heard = _supervise(argv, where, elastic, blacklist)
        if status == 0:
            return 0
        if stopped:
            _say(f"stopped (exit status {status}); {_kept(directory)}")
            return status
        if status == contract.RESTART_STATUS:
            _say("the ranks stopped at a commit for the new hosts; relaunching")
        else:
            failures += 1
            if failures > elastic.reset_limit:
                _say(
                    f"the job failed {failures} times, more than --reset-limit "
                    f"{elastic.reset_limit}; giving up (exit status {status}); "
                    f"{_kept(directory)}"
                )
                return status
            for name in culprits(where[0], heard.unreachable, heard.failed):
                _say(f"host {name} {blacklist.fail(name)}")
            _say(f"the job failed (exit status {status}); relaunching from its last commit")
        generation += 1


def _kept(directory):
    if not os.listdir(directory):
        return "it made no commit"
    return (
        f"its commits are in {directory}: pass --elastic-state-dir {directory} to resume "
        "from the last one"
    )


def _launch_env(directory, generation):
    return {contract.ELASTIC_DIR: directory, contract.ELASTIC_GENERATION: str(generation)}


def wait_for_placement(
    elastic: Elastic, blacklist: Blacklist, patient: bool = False
) -> tuple[tuple[Host, ...], int]:
    """Return the placement on the hosts discovered, waiting up to ``elastic.timeout``.

    Hosts that ``blacklist`` leaves out are not used. A discovery script that fails or
    prints what cannot be parsed raises at once, unless ``patient`` (a relaunch): then it is
    asked again until the time is up.
    """
    deadline = time.monotonic() + elastic.timeout
    said = None
    while True:
        try:
            found = discover(elastic)
        except ValueError as err:  # LaunchError, HostfileError
            if not patient or time.monotonic() >= deadline:
                raise
            news = f"warning: {err}; asking again"
        else:
            usable = blacklist.usable(found)
            where = placement(elastic, usable)
            if where is not None:
                return where
            slots = _slots(usable, found, blacklist)
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"the host discovery script {elastic.script!r} listed {slots}, fewer than "
                    f"--min-np {elastic.min_np}, for --elastic-timeout {elastic.timeout:g} s"
                )
            news = f"waiting for {elastic.min_np} slots (--min-np); the hosts have {slots}"
        if said != news:
            _say(news)
            said = news
        time.sleep(DISCOVERY_SECONDS)


def _slots(usable, found, blacklist):
    """Say how many slots ``usable`` has, and which hosts of ``found`` are left out."""
    slots = sum(host.slots for host in usable)
    listed = sum(host.slots for host in found)
    if slots == listed:
        return f"{slots} slots"
    return f"{slots} usable slots of {listed} ({blacklist.describe(found)})"


def _supervise(argv, where, elastic, blacklist):
    """Run one launch; return its exit status, whether a signal stopped it, what ranks said.

    Once every rank has started, the hosts are discovered again every DISCOVERY_SECONDS,
    and the ranks are notified once if a launch now would differ from ``where`` (a host
    came, went, or ended its cool-down).
    """
    heard = watchdog.Heard()
    stop = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        previous = {sig: signal.signal(sig, _stopper(proc, sig, stop)) for sig in _STOPPING}
        pipes = (proc.stdout.fileno(), proc.stderr.fileno(), heard)
        relay = threading.Thread(target=watchdog.relay_noting, args=pipes, daemon=True)
        relay.start()
        try:
            notified, complained = False, None
            while not _ended(proc):
                if watchdog.end_if_stuck(proc, heard):
                    break
                if notified or stop or len(heard.started) < where[1]:
                    continue
                try:
                    now = placement(elastic, blacklist.usable(discover(elastic)))
                    complained = None
                except ValueError as err:  # LaunchError, HostfileError: the job goes on
                    if str(err) != complained:
                        _say(f"warning: {err}; asking again")
                        complained = str(err)
                    continue
                if now != where and proc.poll() is None:
                    after = "too few slots" if now is None else _describe(now[0])
                    _say(f"the hosts have changed ({after}); the ranks stop at their next commit")
                    proc.send_signal(contract.NOTICE_SIGNAL)
                    notified = True
            relay.join()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    status = proc.returncode
    return (128 - status if status < 0 else status), bool(stop), heard


def _ended(proc):
    try:
        proc.wait(timeout=DISCOVERY_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return True


# A SIGINT from the terminal reaches mpirun too (one process group); the others are passed on.
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stopper(proc, sig, stop):
    def handler(signum, frame):
        stop.append(signum)
        if sig != signal.SIGINT:
            proc.send_signal(signum)

    return handler


def _describe(found):
    return ", ".join(f"{host.name}:{host.slots}" for host in found)


def _say(text):
    print(f"ringtrain-run: {text}", file=sys.stderr, flush=True)
