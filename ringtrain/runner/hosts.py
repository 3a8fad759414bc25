"""Parse hostfiles and ``-H`` host lists into Host records, and check ``-np`` against the slots."""

import dataclasses
import re

# "name", "name slots=N" or "name:N"; N is checked separately so that "slots=0" gets its own error.
_SLOTS_LINE = re.compile(r"(?P<name>[^\s:=#,]+)\s+slots\s*=\s*(?P<slots>[+-]?\d+)")
_COLON_LINE = re.compile(r"(?P<name>[^\s:=#,]+):(?P<slots>[+-]?\d+)")
_BARE_LINE = re.compile(r"(?P<name>[^\s:=#,]+)")


class HostfileError(ValueError):
    """A hostfile or host list that cannot be used; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine of the job and how many ranks it may take."""

    name: str
    slots: int


def parse_hostfile(path: str) -> list[Host]:
    """Read an Open MPI hostfile (``host slots=N``, ``host:N`` or ``host``; ``#`` comments)."""
    with open(path, encoding="utf-8") as file:
        lines = _uncommented(file)
    return _parse_entries(path, lines, hostfile=True)


def parse_host_list(text: str) -> list[Host]:
    """Parse a ``-H`` list such as ``host1:2,host2:2`` (a host without ``:N`` has one slot)."""
    return _parse_entries("-H", [item.strip() for item in text.split(",")], hostfile=False)


def parse_discovered(text: str, source: str, default_slots: int) -> list[Host]:
    """Parse a host discovery script's output: ``host:N`` or ``host`` lines, maybe none.

    A host without ``:N`` gets ``default_slots``.
    """
    lines = _uncommented(text.splitlines())
    if not any(lines):
        return []
    return _parse_entries(source, lines, hostfile=True, default_slots=default_slots)


def host_of_rank(hosts: list[Host], rank: int) -> str | None:
    """Return the host that ``rank`` lands on when ranks fill the slots in order, if any."""
    for host in hosts:
        if rank < host.slots:
            return host.name
        rank -= host.slots
    return None


def check_slots(hosts: list[Host], num_proc: int, source: str, oversubscribe: bool) -> None:
    """Raise HostfileError if ``num_proc`` ranks do not fit the slots, unless oversubscribing."""
    slots = sum(host.slots for host in hosts)
    if num_proc > slots and not oversubscribe:
        raise HostfileError(
            f"{source}: -np {num_proc} is more than the {slots} slots listed; "
            "add slots or pass --oversubscribe"
        )


def _uncommented(lines):
    """Return ``lines`` without ``#`` comments and surrounding blanks."""
    return [line.split("#", 1)[0].strip() for line in lines]


def _parse_entries(source, texts, hostfile, default_slots=1):
    hosts = []
    first_seen = {}
    for number, text in enumerate(texts, 1):
        where = f"{source}:{number}" if hostfile else f"-H entry {number}"
        if not text:
            if hostfile:
                continue
            raise HostfileError(f"{where}: empty host name")
        host = _parse_entry(text, where, hostfile, default_slots)
        if host.name in first_seen:
            raise HostfileError(
                f"{where}: host {host.name!r} is listed twice (first at {first_seen[host.name]}); "
                "list it once with all its slots"
            )
        first_seen[host.name] = where
        hosts.append(host)
    if not hosts:
        raise HostfileError(f"{source}: no hosts listed")
    return hosts


def _parse_entry(text, where, hostfile, default_slots):
    patterns = [_SLOTS_LINE, _COLON_LINE, _BARE_LINE] if hostfile else [_COLON_LINE, _BARE_LINE]
    for pattern in patterns:
        match = pattern.fullmatch(text)
        if match:
            slots = int(match.groupdict().get("slots") or default_slots)
            if slots <= 0:
                raise HostfileError(f"{where}: slots must be at least 1, not {slots}: {text!r}")
            return Host(match["name"], slots)
    expected = "'host slots=N', 'host:N' or 'host'" if hostfile else "'host:N' or 'host'"
    raise HostfileError(f"{where}: cannot parse {text!r}; expected {expected}")
