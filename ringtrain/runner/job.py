"""The record of one launch: what to run, on how many ranks, where, and with which settings."""

import dataclasses
import ipaddress

from ringtrain.runner.hosts import Host


class LaunchError(ValueError):
    """A launch that cannot be done as asked; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Job:
    """Everything an argv builder needs; ``hosts=None`` means this machine only."""

    command: tuple[str, ...]
    num_proc: int
    hosts: tuple[Host, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    network_interface: str | None = None
    oversubscribe: bool = False
    mpi_args: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.command:
            raise LaunchError("no command to run")
        if self.num_proc < 1:
            raise LaunchError(f"-np must be at least 1, not {self.num_proc}")
        if self.network_interface is not None:
            _check_network_interface(self.network_interface)


def _check_network_interface(text):
    for item in text.split(","):
        if not item.strip():
            raise LaunchError(f"--network-interface {text!r} has an empty entry")
        if "/" in item:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError as err:
                raise LaunchError(f"--network-interface: {err}") from None
