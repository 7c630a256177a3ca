"""File helpers: atomic writes (temp file + rename), checksums, JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from xmr.errors import XmrError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (sorted keys, 2-space indent)."""
    with atomic_path(path, ".json") as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise XmrError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


# files at least this large have their digest cached (COCO's region features are ~33 GB: minutes to hash)
CACHE_MIN_BYTES = 64 << 20


def _digest_cache_entry(path: Path) -> Path:
    """Cache file of ``path``'s digest, keyed by what changes when the file does: real path, inode, size, mtime."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    root = Path(os.environ.get("XMR_CACHE_DIR") or Path.home() / ".cache" / "xmr")
    return root / "sha256" / f"{hashlib.sha1(key.encode()).hexdigest()}.txt"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20, cache: bool = True) -> str:
    """Hex SHA-256 of a file's bytes. Digests of large files are cached (``$XMR_CACHE_DIR``, default
    ``~/.cache/xmr``) under a key of path, inode, size and mtime, so a changed file is hashed again."""
    path = Path(path)
    entry = _digest_cache_entry(path) if cache and path.stat().st_size >= CACHE_MIN_BYTES else None
    if entry is not None and entry.exists():
        cached = entry.read_text().strip()
        if len(cached) == 64:
            return cached
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    if entry is not None:
        try:
            with atomic_path(entry, ".txt") as tmp:
                tmp.write_text(digest + "\n")
        except OSError:  # a read-only home: hashing still works, only slower next time
            pass
    return digest


def require_file(path: str | os.PathLike, hint: str) -> Path:
    """Return ``path`` if it exists, else raise an XmrError naming it and saying how to obtain it."""
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: not found; {hint}")
    return path
