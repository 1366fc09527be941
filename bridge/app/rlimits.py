"""The process's open-file limit: raised at start as far as the system allows.

Each STOMP client costs the bridge two descriptors (its own socket and its upstream one), so a
bridge allowed 10,000 connections wants over 20,000; distributions start processes at 1,024.
"""

from __future__ import annotations

import resource

# Descriptors the bridge needs beyond its clients': listeners, the engine's pipes, journal
# files, admin requests, the staging and check connections.
SPARE = 256
# What to ask for when the hard limit is unlimited (Linux's default fs.nr_open).
UNLIMITED_ASK = 1 << 20


def raise_open_files() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard one; returns (soft, hard) as they now stand."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = UNLIMITED_ASK if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft, hard
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def needed(max_connections: int) -> int:
    """Descriptors a bridge with this connection limit may use at most."""
    return 2 * max_connections + SPARE
