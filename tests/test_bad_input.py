"""Table of malformed calls across the public API.  Each runs in the guest
Python, a separate process: a crash would surface as GuestCrashed, a test failure."""
from __future__ import annotations

import re
import tempfile

import pytest

from conftest import guest
from test_runtime_ops import all_lib  # noqa: F401 - shared session fixture

_TMP = tempfile.mkdtemp(prefix="tilegen-bad-")


def _names():
    from guest_calls import BAD_KERNEL_CALLS
    import guest_bad
    # the names are static: read them from the module without a library
    import inspect
    src = inspect.getsource(guest_bad._cases)
    host = sorted(set(re.findall(r'^\s+"([^"]+)": \(lambda', src, re.M)))
    return host + [f"kernel: {n}" for n in BAD_KERNEL_CALLS]


NAMES = _names()


def test_table_is_large_enough():
    assert len(NAMES) >= 40


@pytest.mark.parametrize("name", NAMES)
def test_malformed_call_raises_documented_error(name, all_lib, f32_lib):
    g = guest("max")
    etype, msg = g.call("guest_bad:run", str(all_lib), str(f32_lib), _TMP, name)
    want_type, want_rx = g.call("guest_bad:expected", str(all_lib), _TMP, name)
    assert etype == want_type, f"{name}: got {etype}: {msg}"
    assert re.search(want_rx, msg), f"{name}: message {msg!r} does not name the problem ({want_rx!r})"
