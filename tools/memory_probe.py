"""Peak-memory measurement shared by the benchmarks (Linux /proc; not imported by asrkit)."""

import ctypes


def rss_kib(field: str = "VmRSS") -> int:
    """A /proc/self/status field in KiB: VmRSS (resident now) or VmHWM (peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Returns freed heap to the OS, resets VmHWM to the resident size, returns that size."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kib("VmRSS")
