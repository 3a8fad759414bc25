#!/bin/sh
# Host discovery for an elastic job (ringtrain-run --host-discovery-script): print the hosts
# that the job may use now, one "host:slots" line each ("host" alone: --slots-per-host).
# ringtrain-run runs it before each launch and every second while the job runs; when the
# answer changes, the job moves to the new hosts at its next commit.
#
#   ringtrain-run -np 2 --min-np 1 --max-np 4 \
#       --host-discovery-script hostfiles/discover-hosts.sh python3 train.py
#
# This one prints the file named by DISCOVER_HOSTS_FILE (default: elastic-hosts next to
# it). A cluster's script would ask its scheduler or cloud instead.
cat "${DISCOVER_HOSTS_FILE:-$(dirname "$0")/elastic-hosts}"
