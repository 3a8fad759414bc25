"""The raw TCP ceiling of a link between two namespace hosts, measured with ``iperf3``."""

import json
import shutil
import subprocess
import time

from ringtrain.bench import netns

_CONNECT_TRIES = 20
_CONNECT_PAUSE = 0.25


def tcp_ceiling(server: str, address: str, client: str, seconds: float):
    """Return (bits per second, note) of TCP streams both ways at once between two hosts.

    ``iperf3 --bidir`` runs from host ``client`` to host ``server`` (at ``address``), as a
    ring loads a host's link in both directions; the slower direction counts. Without
    ``iperf3`` it returns (None, why).
    """
    if shutil.which("iperf3") is None:
        return None, "no iperf3 here (apt-get install -y iperf3): no TCP ceiling measured"
    listen = ["ip", "netns", "exec", server, "iperf3", "--server", "--one-off", "--bind", address]
    with subprocess.Popen(
        listen, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as listener:
        try:
            report = _client(client, address, seconds)
        finally:
            listener.kill()
    if report is None:
        return None, f"iperf3 found no server at {address} on {server}: no TCP ceiling measured"
    end = report["end"]
    both = [end["sum_received"], end["sum_received_bidir_reverse"]]
    return min(direction["bits_per_second"] for direction in both), None


def _client(client, address, seconds):
    """Run the iperf3 client, retrying while the server starts; return its report or None."""
    command = ["iperf3", "--client", address, "--time", f"{seconds:g}", "--bidir", "--json"]
    for _ in range(_CONNECT_TRIES):
        done = subprocess.run(
            netns.on_host(client, command),
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=False,
        )
        report = json.loads(done.stdout) if done.stdout.strip() else {}
        if done.returncode == 0 and "end" in report:
            return report
        time.sleep(_CONNECT_PAUSE)
    return None
