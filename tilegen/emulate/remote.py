"""Remote calls into an emulated (or native) aarch64 Python.

``GuestSession`` starts one long-lived guest interpreter (``python -m tilegen.emulate.remote``
under ``tilegen emulate``) and calls module-level functions in it with pickled arguments,
so that tests written on the host can execute kernels on any qemu CPU model without paying
the guest's start-up (numpy import) per call.  If the guest dies (SIGILL, SIGSEGV) the call
raises :class:`GuestCrashed` and the next call starts a fresh guest.

Protocol: length-prefixed pickles over the guest's stdin/stdout.  The guest redirects its own
``sys.stdout`` to stderr so that prints cannot corrupt the channel.
"""
from __future__ import annotations

import importlib
import os
import pickle
import struct
import subprocess
import sys
import traceback
from typing import Any, Sequence

__all__ = ["GuestSession", "GuestError", "GuestCrashed", "GuestTimeout"]

_HDR = struct.Struct("<Q")


class GuestError(RuntimeError):
    """The called function raised in the guest; ``.type_name`` names the exception class."""

    def __init__(self, type_name: str, message: str, tb: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.guest_traceback = type_name, message, tb


class GuestCrashed(RuntimeError):
    """The guest process died during a call (e.g. SIGILL from an instruction the CPU lacks)."""

    def __init__(self, returncode: int | None, stderr: str) -> None:
        sig = f" (signal {-returncode})" if returncode is not None and returncode < 0 else ""
        super().__init__(f"guest Python died with exit code {returncode}{sig}: {stderr.strip()[-2000:]}")
        self.returncode, self.stderr = returncode, stderr


class GuestTimeout(GuestCrashed):
    """The call took longer than its timeout: the guest was killed (the next call starts a
    fresh one)."""

    def __init__(self, timeout: float, stderr: str) -> None:
        RuntimeError.__init__(self, f"guest call did not return within {timeout:g} s (guest "
                              f"killed): {stderr.strip()[-4000:]}")
        self.returncode, self.stderr, self.timeout = None, stderr, timeout


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HDR.pack(len(data)))
    f.write(data)
    f.flush()


def _recv(f):
    hdr = f.read(_HDR.size)
    if len(hdr) < _HDR.size:
        raise EOFError
    (n,) = _HDR.unpack(hdr)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


class GuestSession:
    """A persistent guest Python on CPU model ``cpu`` (with optional SVE/SME vector lengths)."""

    def __init__(self, cpu: str = "max", sve_vl: int | None = None, sme_vl: int | None = None,
                 paths: Sequence[str] = (), env: dict | None = None) -> None:
        self.cpu, self.sve_vl, self.sme_vl = cpu, sve_vl, sme_vl
        self.paths = [os.fspath(p) for p in paths]
        self.env = dict(env or {})
        self._proc: subprocess.Popen | None = None
        self._errf = None

    def __repr__(self) -> str:
        return f"<GuestSession cpu={self.cpu} sve_vl={self.sve_vl} sme_vl={self.sme_vl}>"

    def _start(self) -> None:
        from .provision import ensure
        from .runner import guest_command
        import tempfile
        argv, env = guest_command(["python", "-m", "tilegen.emulate.remote"], cpu=self.cpu,
                                  sve_vl=self.sve_vl, sme_vl=self.sme_vl, env=None,
                                  toolbox=ensure(quiet=True))
        env = {**env, **self.env}
        if self.paths:
            env["TILEGEN_REMOTE_PATHS"] = os.pathsep.join(self.paths)
        self._errf = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._errf)

    def _stderr(self) -> str:
        if self._errf is None:
            return ""
        self._errf.seek(0)
        return self._errf.read().decode(errors="replace")

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``module:function(*args, **kwargs)`` in the guest and return its result."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc and self._proc.stdin and self._proc.stdout
        try:
            _send(self._proc.stdin, ("call", target, args, kwargs))
            reply = _recv(self._proc.stdout)
        except (EOFError, BrokenPipeError, OSError):
            rc = self._proc.wait()
            err = self._stderr()
            self._proc = None
            raise GuestCrashed(rc, err) from None
        if reply[0] == "ok":
            return reply[1]
        raise GuestError(reply[1], reply[2], reply[3])

    def call_with_timeout(self, timeout: float, target: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call`, but a call still running after ``timeout`` seconds kills the guest and
        raises :class:`GuestTimeout` (with the guest's stderr, e.g. a faulthandler dump)."""
        import threading
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        proc = self._proc
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            proc.kill()
        timer = threading.Timer(timeout, kill)
        timer.daemon = True
        timer.start()
        try:
            return self.call(target, *args, **kwargs)
        except GuestCrashed as e:
            if fired.is_set():
                raise GuestTimeout(timeout, e.stderr) from None
            raise
        finally:
            timer.cancel()

    def close(self) -> None:
        if self._proc is not None:
            try:
                if self._proc.poll() is None:
                    _send(self._proc.stdin, ("quit",))
                    self._proc.wait(timeout=30)
            except Exception:
                self._proc.kill()
            self._proc = None

    def __enter__(self) -> "GuestSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve() -> None:
    for p in reversed(os.environ.get("TILEGEN_REMOTE_PATHS", "").split(os.pathsep)):
        if p:
            sys.path.insert(0, p)
    rx = sys.stdin.buffer
    tx = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr      # stray prints go to stderr, never into the channel
    while True:
        try:
            msg = _recv(rx)
        except EOFError:
            return
        if msg[0] == "quit":
            return
        _, target, args, kwargs = msg
        try:
            mod, _, fn = target.partition(":")
            result = getattr(importlib.import_module(mod), fn)(*args, **kwargs)
            reply = ("ok", result)
        except BaseException as e:  # report everything, keep serving
            reply = ("err", type(e).__name__, str(e), traceback.format_exc())
        _send(tx, reply)


if __name__ == "__main__":
    _serve()
