"""The process's resources: its open-file limit, raised at start as far as the system allows,
and how freed memory goes back to the system.

Each STOMP client costs the bridge two descriptors (its own socket and its upstream one), so a
bridge allowed 10,000 connections wants over 20,000; distributions start processes at 1,024.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys

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


# glibc's mallopt: allocations of at least this many bytes get pages of their own, given back
# when freed. Setting it also stops glibc raising the threshold by itself (up to 32 MiB) after
# large blocks are freed, which made a bridge that had relayed a few large frames keep about
# 100 MB for ever.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024


def return_freed_memory() -> bool:
    """Make large freed blocks go back to the system (glibc); False where that cannot be set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
