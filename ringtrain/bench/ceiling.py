"""The raw TCP ceiling of a link between two namespace hosts, measured with ``iperf3``."""

import json
import shutil
import subprocess
import time

from ringtrain.bench import netns

_CONNECT_TRIES = 20
_CONNECT_PAUSE = 0.25
_BOTH_WAYS = {"sum_received", "sum_received_bidir_reverse"}


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
            report, error = _client(client, address, seconds)
        finally:
            listener.kill()
    if report is None:
        return None, f"iperf3 to {address} on {server} failed ({error}): no TCP ceiling measured"
    end = report["end"]
    return min(end[direction]["bits_per_second"] for direction in _BOTH_WAYS), None


def _client(client, address, seconds):
    """Run the iperf3 client, retrying while the server starts; return (report, None).

    A try that reports no traffic both ways (iperf3 3.12 exits 0 with an ``error`` when the
    server is not listening yet) is retried; after the last, return (None, its error).
    """
    command = ["iperf3", "--client", address, "--time", f"{seconds:g}", "--bidir", "--json"]
    error = "no try ran"
    for _ in range(_CONNECT_TRIES):
        done = subprocess.run(
            netns.on_host(client, command),
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=False,
        )
        report = json.loads(done.stdout) if done.stdout.strip() else {}
        end = report.get("end", {})
        if done.returncode == 0 and _BOTH_WAYS <= end.keys() and "error" not in report:
            return report, None
        error = report.get("error") or done.stderr.strip() or f"exit status {done.returncode}"
        time.sleep(_CONNECT_PAUSE)
    return None, error
