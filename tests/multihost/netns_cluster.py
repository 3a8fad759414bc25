"""A cluster of test hosts made of network namespaces on this machine (needs root, iproute2).

Each host is a network namespace whose ``eth0`` is one end of a veth pair; the other ends sit
on a bridge inside a separate switch namespace. Nothing is added to the machine's own network
namespace, so traffic stays between the test hosts (and their loopbacks). Addresses come from
a private test subnet, 10.231.0.0/24 by default. A host gets its own hostname only inside a
UTS namespace: ``on_host`` and the agent (``netns_agent.py``, used by Open MPI instead of ssh)
both set it.

    python tests/multihost/netns_cluster.py up --hosts 3   # make rtmh-0 .. rtmh-2
    python tests/multihost/netns_cluster.py down           # remove them, also after a crash
"""

import argparse
import atexit
import contextlib
import fcntl
import glob
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "rtmh"
SUBNET = "10.231.0.0/24"
AGENT = Path(__file__).with_name("netns_agent.py")
_IP_TIMEOUT = 20


def host_names(count: int, prefix: str = PREFIX) -> list[str]:
    """Return the names (namespace and hostname alike) of a cluster of ``count`` hosts."""
    return [f"{prefix}-{index}" for index in range(count)]


def agent() -> str:
    """Return the remote-shell agent command for ``--prtemca plm_ssh_agent``."""
    return f"{sys.executable} {AGENT}"


def on_host(name: str, command: list[str]) -> list[str]:
    """Return an argv that runs ``command`` on host ``name``, under that hostname."""
    setup = 'hostname "$0" && exec "$@"'
    return ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", setup, name, *command]


def why_unavailable(prefix: str = PREFIX) -> str | None:
    """Return why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"no `{tool}` command; install the {package} package"
    probe = f"{prefix}-probe"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    return None


def up(count: int, prefix: str = PREFIX, subnet: str = SUBNET) -> dict[str, str]:
    """Make a cluster of ``count`` hosts; return each host's name and address."""
    switch = f"{prefix}-switch"
    addresses = list(ipaddress.ip_network(subnet).hosts())[:count]
    length = ipaddress.ip_network(subnet).prefixlen
    _ip("netns", "add", switch)
    _ip("-n", switch, "link", "set", "lo", "up")
    _ip("-n", switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", switch, "link", "set", "br0", "up")
    hosts = {}
    for index, (name, address) in enumerate(zip(host_names(count, prefix), addresses, strict=True)):
        port = f"port{index}"
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        _ip(
            "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", switch
        )
        _ip("-n", switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", name, "addr", "add", f"{address}/{length}", "dev", "eth0")
        _ip("-n", name, "link", "set", "eth0", "up")
        hosts[name] = str(address)
    return hosts


def down(prefix: str = PREFIX) -> None:
    """Remove every namespace of the cluster ``prefix`` and what its ranks left; idempotent."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.startswith(f"{prefix}-")]
    for name in names:
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
    for segment in glob.glob(f"/dev/shm/sm_segment.{prefix}-*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment)
    for session in glob.glob(f"/tmp/ompi.{prefix}-*") + glob.glob(f"/tmp/prte.{prefix}-*"):
        shutil.rmtree(session, ignore_errors=True)


@contextlib.contextmanager
def cluster(count: int, prefix: str = PREFIX, subnet: str = SUBNET, wait: float = 300):
    """Hold the cluster ``prefix`` for one user at a time; make it, yield it, always remove it.

    A cluster left by a crashed run is removed first; an ``atexit`` hook removes this one
    should the process end without unwinding.
    """
    with _lock(prefix, wait):
        down(prefix)
        atexit.register(down, prefix)
        try:
            yield up(count, prefix, subnet)
        finally:
            down(prefix)
            atexit.unregister(down)


@contextlib.contextmanager
def _lock(prefix, wait):
    with open(f"/tmp/ringtrain-netns-{prefix}.lock", "w") as file:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster {prefix!r} stayed in use for {wait} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _ip(*args, check=True):
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--prefix", default=PREFIX)
    parser.add_argument("--subnet", default=SUBNET)
    args = parser.parse_args()
    if args.action == "down":
        down(args.prefix)
        return
    reason = why_unavailable(args.prefix)
    if reason:
        sys.exit(reason)
    down(args.prefix)
    for name, address in up(args.hosts, args.prefix, args.subnet).items():
        print(name, address)


if __name__ == "__main__":
    _main()
