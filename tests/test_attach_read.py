"""The compiled cross-memory read under the attach ring: it copies, and it reports failures."""

import errno
import os
import sys

import numpy as np
import pytest

from ringtrain.transport import attach

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process_vm_readv is Linux's"
)


@pytest.mark.parametrize("length", [1, 3, 1025, 300_007])
def test_read_copies_a_buffer_of_a_process(length):
    source = np.random.default_rng(length).random(length)
    out = np.zeros(length)
    attach.read(os.getpid(), source.ctypes.data, out)
    np.testing.assert_array_equal(out, source)


def test_read_of_an_unmapped_address_names_the_address_process_and_errno():
    out = np.zeros(4)
    with pytest.raises(OSError, match=f"at 0x10 of process {os.getpid()}") as caught:
        attach.read(os.getpid(), 0x10, out)
    assert caught.value.errno == errno.EFAULT
    assert "Bad address" in str(caught.value)


def test_read_from_a_process_that_does_not_exist_fails_with_esrch():
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1  # no process can have this pid
    with pytest.raises(OSError) as caught:
        attach.read(beyond, 0x1000, np.zeros(1))
    assert caught.value.errno == errno.ESRCH
