"""Clocks of ``tilegen bench`` (guest side): what a timed interval is measured with.

* :class:`PerfCycles`: the core's cycle counter of the calling thread, through
  ``perf_event_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)`` (a ctypes ``syscall``; user
  space only, so ``perf_event_paranoid`` <= 2 allows it), plus the wall time of the interval.
* :class:`WallClock`: ``time.perf_counter_ns`` only; cycles are then wall time x the core
  frequency (:func:`core_frequency`), and the report says so.

:class:`ClockRoutines` loads the small shared object built from ``templates/bench_timer.S.j2``
(``CNTFRQ_EL0``, ``CNTVCT_EL0``, a chain of dependent one-cycle ADDs).  The core frequency is
``--freq-ghz`` if given, else measured with the ADD chain (n x chain cycles over its wall
time); the generic timer's frequency (``CNTFRQ_EL0``) is reported beside it but is not the
core clock (24 MHz on Apple cores, 1 GHz on recent Neoverse systems).

:func:`emulation` says whether this process runs under qemu-user: the kernel's own
architecture (``/proc/sys/kernel/arch``, which qemu-user passes through from the host) is not
arm64 while Python runs aarch64 code, or ``TILEGEN_EMULATED_CPU`` (set by
``tilegen.emulate.runner.guest_command``) names a qemu model.
"""
from __future__ import annotations

import ctypes
import os
import platform
import time
from pathlib import Path
from typing import Callable

from .stats import Reading

__all__ = ["EMULATED_LABEL", "emulation", "PerfCycles", "WallClock", "open_timer",
           "ClockRoutines", "core_frequency", "cpufreq_max_ghz", "cpu_id", "ADD_CHAIN",
           "PERF_SW_TASK_CLOCK"]

EMULATED_LABEL = "emulated: not a hardware timing"
ADD_CHAIN = 16          # dependent ADDs per iteration of tilegen_add_chain (the template's chain)
_PERF_SYSCALL = {"aarch64": 241, "arm64": 241, "x86_64": 298}
_PERF_TYPE_HARDWARE, _PERF_COUNT_HW_CPU_CYCLES = 0, 0
PERF_SW_TASK_CLOCK = (1, 1)     # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK (ns on the CPU)
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403
_FLAG_DISABLED, _FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6
_PERF_FLAG_FD_CLOEXEC = 8


def emulation() -> tuple[bool, str]:
    """(emulated, how it was decided)."""
    machine = platform.machine()
    try:
        kernel = Path("/proc/sys/kernel/arch").read_text().strip()
    except OSError:
        kernel = ""
    if machine in ("aarch64", "arm64") and kernel and kernel not in ("aarch64", "arm64"):
        return True, f"/proc/sys/kernel/arch is {kernel} under an {machine} Python (qemu-user)"
    env = os.environ.get("TILEGEN_EMULATED_CPU")
    if env and env != "host":
        return True, f"TILEGEN_EMULATED_CPU={env} (tilegen emulate)"
    return False, f"native {machine}" + (f" (kernel {kernel})" if kernel else "")


class WallClock:
    """``time.perf_counter_ns`` around a batch of calls."""
    counts_cycles = False
    name = "wall"

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def time(self, fn: Callable[[], None], batch: int) -> Reading:
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        return Reading(float(time.perf_counter_ns() - t0))

    def close(self) -> None:
        pass


class PerfCycles(WallClock):
    """The calling thread's core cycles (user space) and the wall time of each interval."""
    counts_cycles = True
    name = "perf_event"

    def __init__(self, event: tuple[int, int] = (_PERF_TYPE_HARDWARE, _PERF_COUNT_HW_CPU_CYCLES)
                 ) -> None:
        """``event``: perf_event_attr (type, config); the default is the core's cycles (the
        tests also open a software event, which every Linux kernel counts)."""
        nr = _PERF_SYSCALL.get(platform.machine())
        if nr is None:
            raise OSError(f"no perf_event_open syscall number for {platform.machine()}")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        attr = (ctypes.c_uint8 * 64)()
        ctypes.c_uint32.from_buffer(attr, 0).value = event[0]
        ctypes.c_uint32.from_buffer(attr, 4).value = 64          # PERF_ATTR_SIZE_VER0
        ctypes.c_uint64.from_buffer(attr, 8).value = event[1]
        ctypes.c_uint64.from_buffer(attr, 40).value = (_FLAG_DISABLED | _FLAG_EXCLUDE_KERNEL
                                                       | _FLAG_EXCLUDE_HV)
        fd = self._libc.syscall(ctypes.c_long(nr), attr, ctypes.c_int(0), ctypes.c_int(-1),
                                ctypes.c_int(-1), ctypes.c_ulong(_PERF_FLAG_FD_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err) if err else "failed")
        self.fd = int(fd)

    def _ioctl(self, req: int) -> None:
        if self._libc.ioctl(ctypes.c_int(self.fd), ctypes.c_ulong(req), ctypes.c_ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), "perf_event ioctl failed")

    def time(self, fn: Callable[[], None], batch: int) -> Reading:
        self._ioctl(_IOC_RESET)
        t0 = time.perf_counter_ns()
        self._ioctl(_IOC_ENABLE)
        for _ in range(batch):
            fn()
        self._ioctl(_IOC_DISABLE)
        t1 = time.perf_counter_ns()
        cycles = int.from_bytes(os.read(self.fd, 8), "little")
        return Reading(float(t1 - t0), float(cycles))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_timer(kind: str = "auto") -> tuple[WallClock, str]:
    """(timer, why): ``kind`` "perf" (the cycle counter or OSError), "wall", or "auto" (the
    cycle counter when the kernel permits it, else the wall clock, saying why)."""
    if kind == "wall":
        return WallClock(), "wall clock requested (--clock wall)"
    try:
        t = PerfCycles()
        probe = t.time(lambda: None, 1)     # some kernels open the event but never count
        if probe.cycles is None:
            raise OSError("the counter did not count")
        return t, "perf_event_open(PERF_COUNT_HW_CPU_CYCLES), user space, calling thread"
    except OSError as e:
        why = (f"the cycle counter (perf_event_open, PERF_COUNT_HW_CPU_CYCLES) is not "
               f"available: {e.strerror or e}" + (f" (errno {e.errno})" if e.errno else ""))
        if kind == "perf":
            raise OSError(e.errno, f"--clock perf: {why}") from None
        return WallClock(), f"wall clock: {why}"


class ClockRoutines:
    """The routines of ``templates/bench_timer.S.j2`` in their own shared object."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.lib = ctypes.CDLL(str(path))
        for name, args in (("tilegen_cntfrq", []), ("tilegen_cntvct", []),
                           ("tilegen_add_chain", [ctypes.c_uint64])):
            f = getattr(self.lib, name)
            f.restype, f.argtypes = ctypes.c_uint64, args

    def cntfrq(self) -> int:
        return int(self.lib.tilegen_cntfrq())

    def cntvct(self) -> int:
        return int(self.lib.tilegen_cntvct())

    def add_chain_ghz(self, iters: int = 2_000_000, reps: int = 5) -> float:
        """Core clock in GHz: the fastest of ``reps`` runs of the ADD chain (one cycle each)."""
        best = None
        self.lib.tilegen_add_chain(iters // 10)         # warm up (frequency ramp)
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            got = self.lib.tilegen_add_chain(iters)
            dt = time.perf_counter_ns() - t0
            if got != iters * ADD_CHAIN:
                raise RuntimeError(f"tilegen_add_chain returned {got}, not {iters * ADD_CHAIN}")
            best = dt if best is None else min(best, dt)
        return iters * ADD_CHAIN / best


def core_frequency(routines: ClockRoutines | None, given_ghz: float | None) -> tuple[float | None, str]:
    """(core GHz, source) used to turn wall time into cycles."""
    if given_ghz is not None:
        return given_ghz, "--freq-ghz"
    if routines is not None:
        return routines.add_chain_ghz(), (f"measured: {ADD_CHAIN} dependent ADDs per loop "
                                          f"iteration, one cycle each")
    return None, "unknown (no clock routines)"


def cpufreq_max_ghz() -> float | None:
    """``cpuinfo_max_freq`` of cpu0 (cpufreq sysfs), for information."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6
    except (OSError, ValueError):
        return None


def cpu_id() -> str:
    """The CPU as /proc/cpuinfo names it (model name, or implementer/part), with the machine."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        fields.setdefault(key.strip(), val.strip())
    parts = [fields[f] for f in ("model name", "CPU implementer", "CPU part") if fields.get(f)]
    return " ".join([platform.machine(), *parts])
