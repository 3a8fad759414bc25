"""Remote-shell agent of the namespace test cluster: Open MPI runs it where it would run ssh.

``python -m ringtrain.bench.netns_agent HOST WORD...`` joins the words with spaces, as ssh
does, and runs them in a shell inside network namespace HOST, under a UTS namespace whose
hostname is HOST.
"""

import os
import shlex
import sys


def main() -> None:
    """Exec the remote command inside the namespace named by the first argument."""
    host, *words = sys.argv[1:]
    script = f"hostname {shlex.quote(host)} || exit 1; {' '.join(words)}"
    os.execvp("ip", ["ip", "netns", "exec", host, "unshare", "--uts", "sh", "-c", script])


if __name__ == "__main__":
    main()
