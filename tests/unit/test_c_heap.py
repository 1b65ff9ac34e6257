"""The node process's C heap: glibc's malloc thresholds fixed, so freed buffers go back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from chronowheel.errors import ConfigError
from chronowheel.node.c_heap import fix_thresholds, glibc_mallopt
from chronowheel.settings import Settings

# A thread fills its own heap with 1 MiB buffers, keeps a small block after them and frees the
# buffers, after a 16 MiB buffer was freed, as the node's threads do with fetches and pages.
# Prints how many MiB the frees gave back.
_THREAD_BUFFERS = textwrap.dedent("""
    import os, sys, threading
    from chronowheel.node.c_heap import fix_thresholds

    def resident():
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    print(fix_thresholds(int(sys.argv[1])), file=sys.stderr)
    big = bytearray(16 << 20)
    del big
    kept = []

    def work():
        buffers = []
        for _ in range(20):
            b = bytearray(1 << 20)
            b[::4096] = b"x" * 256  # touch every page
            buffers.append(b)
        kept.append(bytearray(1000))
        before = resident()
        buffers.clear()
        print((before - resident()) >> 20)

    t = threading.Thread(target=work)
    t.start()
    t.join()
""")


def _released_mib(threshold_bytes: int) -> int:
    done = subprocess.run([sys.executable, "-c", _THREAD_BUFFERS, str(threshold_bytes)],
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(glibc_mallopt() is None, reason="not glibc")
def test_fixed_thresholds_give_a_threads_freed_buffers_back_where_dynamic_ones_keep_them() -> None:
    # Dynamic: the freed 16 MiB block raised the mmap threshold to 16 MiB and the trim
    # threshold to 32 MiB, so the buffers came from the thread's heap and its 20 MiB free top
    # stays resident.
    assert _released_mib(0) <= 2
    assert _released_mib(131_072) >= 18


def test_fixing_thresholds_leaves_them_to_the_environment_or_to_zero(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert "left dynamic" in fix_thresholds(0)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_thresholds(131_072) == \
        "glibc's malloc thresholds left to MALLOC_MMAP_THRESHOLD_ from the environment"


def test_the_threshold_setting_is_checked() -> None:
    for bad in (-1, (1 << 25) + 1):
        with pytest.raises(ConfigError, match="malloc_threshold_bytes"):
            Settings(malloc_threshold_bytes=bad)
    assert Settings(malloc_threshold_bytes=0).malloc_threshold_bytes == 0
