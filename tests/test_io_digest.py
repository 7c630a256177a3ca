"""xmr.io.sha256_file: digests of large files are cached under a key of path, inode, size and mtime."""

from __future__ import annotations

import hashlib
import os

import xmr.io as io


def test_digest_is_cached_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XMR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(io, "CACHE_MIN_BYTES", 4)
    f = tmp_path / "features.h5"
    f.write_bytes(b"abcdefgh")
    want = hashlib.sha256(b"abcdefgh").hexdigest()
    assert io.sha256_file(f) == want
    assert len(list((tmp_path / "cache" / "sha256").iterdir())) == 1
    # same size and mtime but other bytes: the cached digest is served (proof the cache is used) ...
    st = f.stat()
    f.write_bytes(b"ABCDEFGH")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert io.sha256_file(f) == want
    assert io.sha256_file(f, cache=False) == hashlib.sha256(b"ABCDEFGH").hexdigest()
    # ... and a new mtime (what any real write gives) makes it hash again
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert io.sha256_file(f) == hashlib.sha256(b"ABCDEFGH").hexdigest()


def test_small_files_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XMR_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "small.txt"
    f.write_bytes(b"x")
    assert io.sha256_file(f) == hashlib.sha256(b"x").hexdigest()
    assert not (tmp_path / "cache").exists()
