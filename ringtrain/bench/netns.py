"""A cluster of test hosts made of network namespaces on this machine (root, iproute2, tc).

Each host is a network namespace whose ``eth0`` is one end of a veth pair; the other ends sit
on a bridge inside a separate switch namespace. Nothing is added to the machine's own network
namespace, so traffic stays between the test hosts (and their loopbacks). Addresses come from
a private test subnet, 10.231.0.0/24 by default. A host gets its own hostname only inside a
UTS namespace: ``on_host`` and the agent (``python -m ringtrain.bench.netns_agent``, which
Open MPI runs instead of ssh) both set it. ``limit_links`` caps each host's link with ``tc``.

    python -m ringtrain.bench.netns up --hosts 3   # make rtmh-0 .. rtmh-2
    python -m ringtrain.bench.netns down           # remove them, also after a crash
"""

import argparse
import atexit
import contextlib
import fcntl
import glob
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "rtmh"
SUBNET = "10.231.0.0/24"
_IP_TIMEOUT = 20
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_DELAY = re.compile(r"\d+(\.\d+)?(us|ms|s)")
_BURST_SECONDS = 0.002  # the token bucket holds 2 ms of the rate, at least 256 KiB
_MIN_BURST = 256 << 10
# A queue of each kind that why_unavailable tries to add, to see that tc can
_QDISC_PROBES = {
    "tbf": ("root", "tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms"),
    "netem": ("root", "netem", "delay", "1ms"),
}


def host_names(count: int, prefix: str = PREFIX) -> list[str]:
    """Return the names (namespace and hostname alike) of a cluster of ``count`` hosts."""
    return [f"{prefix}-{index}" for index in range(count)]


def agent() -> str:
    """Return the remote-shell agent command for ``--prtemca plm_ssh_agent``."""
    return f"{sys.executable} -m ringtrain.bench.netns_agent"


def on_host(name: str, command: list[str]) -> list[str]:
    """Return an argv that runs ``command`` on host ``name``, under that hostname."""
    setup = 'hostname "$0" && exec "$@"'
    return ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", setup, name, *command]


def parse_rate(text: str) -> int:
    """Return the bits per second of a ``tc`` rate such as ``1gbit`` or ``200mbit``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?bit)", text.strip().lower())
    if not match or float(match[1]) <= 0:
        raise ValueError(
            f"link rate {text!r}: expected a positive number and a unit of "
            f"{', '.join(_RATE_UNITS)} (as tc writes it, e.g. 1gbit or 200mbit)"
        )
    return round(float(match[1]) * _RATE_UNITS[match[2]])


def parse_burst(text: str) -> int:
    """Return the bytes of a token bucket's burst such as ``256kb`` or ``2mb`` (tc's units)."""
    match = re.fullmatch(r"(\d+)(b|kb|mb)", text.strip().lower())
    if not match or int(match[1]) <= 0:
        raise ValueError(
            f"burst {text!r}: expected a positive whole number and a unit of b, kb or mb "
            "(as tc writes it, e.g. 256kb)"
        )
    return int(match[1]) << {"b": 0, "kb": 10, "mb": 20}[match[2]]


def check_delay(text: str) -> str:
    """Return ``text`` if it is a one-way delay ``netem`` takes (``500us``, ``2ms``); else raise."""
    if not _DELAY.fullmatch(text):
        raise ValueError(f"link delay {text!r}: expected a number and us, ms or s, e.g. 1ms")
    return text


def why_unavailable(prefix: str = PREFIX, qdiscs: tuple[str, ...] = ()) -> str | None:
    """Return why namespaces (and ``tc`` with ``qdiscs``) cannot be used here, or None."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    tools = [("ip", "iproute2"), ("unshare", "util-linux")] + [("tc", "iproute2")] * bool(qdiscs)
    for tool, package in tools:
        if shutil.which(tool) is None:
            return f"no `{tool}` command; install the {package} package"
    probe = f"{prefix}-probe"
    made = _ip("netns", "add", probe, check=False)
    try:
        if made.returncode != 0:
            return f"cannot make a network namespace here: {made.stderr.strip()}"
        for qdisc in qdiscs:
            added = _tc(probe, "lo", *_QDISC_PROBES[qdisc], check=False)
            if added.returncode != 0:
                return f"cannot add a tc {qdisc} queue here: {added.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def up(count: int, prefix: str = PREFIX, subnet: str = SUBNET) -> dict[str, str]:
    """Make a cluster of ``count`` hosts; return each host's name and address."""
    switch = _switch(prefix)
    addresses = list(ipaddress.ip_network(subnet).hosts())[:count]
    length = ipaddress.ip_network(subnet).prefixlen
    _ip("netns", "add", switch)
    _ip("-n", switch, "link", "set", "lo", "up")
    _ip("-n", switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", switch, "link", "set", "br0", "up")
    hosts = {}
    for index, (name, address) in enumerate(zip(host_names(count, prefix), addresses, strict=True)):
        port = _port(index)
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


def limit_links(
    names: list[str],
    rate: str,
    delay: str | None = None,
    prefix: str = PREFIX,
    burst: str | None = None,
):
    """Cap each host's link at ``rate`` both ways; ``delay`` is added to what a host sends.

    A token bucket (``tbf``) shapes the host's ``eth0`` egress and the switch port towards
    the host (its ingress); ``netem`` adds the delay on the host's side only, so a message
    between two hosts is delayed once. ``burst``: the bucket's size (``256kb``, the strict
    link); None holds 2 ms of the rate, 256 KiB at least.
    """
    if burst is None:
        burst = str(max(_MIN_BURST, round(parse_rate(rate) / 8 * _BURST_SECONDS)))
    else:
        burst = str(parse_burst(burst))
    shape = ("tbf", "rate", rate, "burst", burst, "latency", "50ms")
    for index, name in enumerate(names):
        if delay is None:
            _tc(name, "eth0", "root", "handle", "1:", *shape)
        else:
            _tc(name, "eth0", "root", "handle", "1:", "netem", "delay", check_delay(delay))
            _tc(name, "eth0", "parent", "1:1", "handle", "10:", *shape)
        _tc(_switch(prefix), _port(index), "root", "handle", "1:", *shape)


def unlimit_links(names: list[str], prefix: str = PREFIX) -> None:
    """Remove the caps of ``limit_links`` from the hosts ``names``; idempotent."""
    for index, name in enumerate(names):
        _tc(name, "eth0", "root", check=False, action="del")
        _tc(_switch(prefix), _port(index), "root", check=False, action="del")


def down(prefix: str = PREFIX) -> None:
    """Remove every namespace of the cluster ``prefix`` and what its ranks left; idempotent."""
    for name in left_behind(prefix):
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


def left_behind(prefix: str = PREFIX) -> list[str]:
    """Return the namespaces of the cluster ``prefix`` that exist now."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(f"{prefix}-")]


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


def _switch(prefix):
    return f"{prefix}-switch"


def _port(index):
    return f"port{index}"


def _ip(*args, check=True):
    return _run(["ip", *args], check)


def _tc(namespace, device, *args, check=True, action="add"):
    return _run(
        ["ip", "netns", "exec", namespace, "tc", "qdisc", action, "dev", device, *args], check
    )


def _run(argv, check):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _main():
    parser = argparse.ArgumentParser(
        prog="python -m ringtrain.bench.netns", description=__doc__.split("\n")[0]
    )
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
