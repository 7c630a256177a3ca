"""The suite stops at once, in one line, when its temporary folder's disk is nearly full (CI once failed with
hundreds of half-written checkpoints instead)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, low_disk_message


def test_low_disk_message_names_the_folder_and_both_sizes():
    assert low_disk_message("/tmp", 3 * 2**30, 2.0) is None
    assert low_disk_message("/tmp", 2 * 2**30, 2.0) is None  # exactly enough
    msg = low_disk_message("/tmp", 3 * 2**29, 2.0)  # 1.5 GB
    assert msg == ("/tmp has 1.5 GB free and the test suite writes up to 2 GB there: free some space, "
                   "or point TMPDIR at a larger disk")


def test_pytest_stops_before_the_first_test_when_the_disk_is_short(tmp_path):
    env = dict(os.environ, XMR_TEST_DISK_GB="1e9", PYTEST_DEBUG_TEMPROOT=str(tmp_path))  # more than any disk
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_suite_disk_guard.py::test_low_disk_message_names_the_folder_and_both_sizes"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert f"{tmp_path} has " in r.stdout and "GB free and the test suite writes up to 1e+09 GB there" in r.stdout
    assert "passed" not in r.stdout and "Traceback" not in r.stdout + r.stderr

    # a --basetemp that does not exist yet: the disk of its nearest existing folder is the one checked
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                        str(tmp_path / "not" / "yet"),
                        "tests/test_suite_disk_guard.py::test_low_disk_message_names_the_folder_and_both_sizes"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and f"{tmp_path} has " in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_a_disk_figure_that_is_not_a_number_is_named(tmp_path):
    env = dict(os.environ, XMR_TEST_DISK_GB="two", PYTEST_DEBUG_TEMPROOT=str(tmp_path))
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_suite_disk_guard.py::test_low_disk_message_names_the_folder_and_both_sizes"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "XMR_TEST_DISK_GB='two': give a number of GB" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr and "passed" not in r.stdout
