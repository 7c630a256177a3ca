"""xmr.core.io.sha256_file: digests of large files are cached under a key of path, inode, size and mtime."""

from __future__ import annotations

import hashlib
import os

import xmr.core.io as io


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


def test_atomic_writes_get_the_mode_of_an_ordinary_new_file(tmp_path):
    """mkstemp's temporary file is 0600; the renamed result must be readable by the group/others the umask
    allows, as a plain open() would make it (shared run directories on a cluster)."""
    import os

    from xmr.core.io import atomic_path

    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "a.json") as tmp:
            tmp.write_text("{}")
        plain = tmp_path / "b.json"
        plain.write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644 == plain.stat().st_mode & 0o777
