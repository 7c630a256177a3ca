"""File helpers: atomic writes (temp file + rename), checksums, JSON."""

from __future__ import annotations

import contextlib
import csv
import errno
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from xmr.core.errors import XmrError


def fault_point(phase: str) -> None:
    """Fault-injection hook of the test suite (tests/test_kill_points.py, docs/faults.md): with
    ``XMR_FAULT=kill_at:PHASE:N`` the process SIGKILLs itself the N-th time (1-based) it reaches ``PHASE``;
    ``XMR_FAULT=enospc_at:write:N`` makes the N-th atomic write fail as on a full disk. Phases: ``write``
    (every atomic write, after the temporary file is complete and before the rename), ``step``, ``validate``,
    ``checkpoint`` (trainer). Unset (always, outside tests): a no-op."""
    spec = os.environ.get("XMR_FAULT")
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    want, _, n = rest.partition(":")
    if want != phase or kind not in ("kill_at", "enospc_at"):
        return
    _FAULT_COUNTS[phase] = _FAULT_COUNTS.get(phase, 0) + 1
    if _FAULT_COUNTS[phase] != int(n or 1):
        return
    if kind == "enospc_at":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


_FAULT_COUNTS: dict[str, int] = {}


def check_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Prove that ``path`` (or, while it does not exist, its nearest existing ancestor, where it would be
    created) takes a file; else a one-line XmrError (read-only disk, no permission), raised before any slow
    work starts. Creates nothing that stays."""
    path = Path(path)
    probe_dir = path
    while not probe_dir.exists() and probe_dir.parent != probe_dir:
        probe_dir = probe_dir.parent
    try:
        if not probe_dir.is_dir():
            raise NotADirectoryError(20, f"{probe_dir} is not a directory")
        fd, probe = tempfile.mkstemp(prefix=".xmr-write-test.", dir=probe_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise XmrError(f"{path}: {what} is not writable ({e.strerror or e}); choose another directory or fix "
                       f"its permissions") from None
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None, fault: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it into place only if the block succeeds. ``fault``: the
    write is one of the fault suite's ``write`` points (False for a best-effort record such as a training's
    progress.json, which the suite's write counts leave out)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if fault:
            fault_point("write")
        if tmp_path.exists():  # mkstemp makes 0600; the file gets the mode an ordinary open() would give it
            os.chmod(tmp_path, _new_file_mode())
        os.replace(tmp_path, path)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise XmrError(f"{path}: disk full or quota exceeded while writing it ({e.strerror}); nothing was "
                       f"replaced (a previous version is intact); free space in {path.parent} and rerun") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@functools.lru_cache(maxsize=1)
def _new_file_mode() -> int:
    """0o666 less the process umask (read once: os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Delete what a process killed inside :func:`atomic_path` for ``path`` left behind (``.NAME.XXXX.SUFFIX``
    beside it); returns the removed paths. Call it only where no other process writes ``path`` right now."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = [p for p in path.parent.glob(f".{glob_escape(path.name)}.*") if p.is_file()]
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (sorted keys, 2-space indent)."""
    with atomic_path(path, ".json") as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: file not found")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))  # JSON is UTF-8, whatever the locale says
    except UnicodeDecodeError:
        raise XmrError(f"{path}: not a JSON file (not UTF-8 text; a binary file such as a .npy?)") from None
    except json.JSONDecodeError as e:
        raise XmrError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def read_history(run_dir: str | os.PathLike) -> list[dict[str, float]]:
    """Rows of a run's ``history.csv`` (numbers as floats; empty cells dropped)."""
    path = Path(run_dir) / "history.csv"
    if not path.exists():
        raise XmrError(f"{path}: no training history; train the run first")
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)]


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


# -- arrays -------------------------------------------------------------------------------------------------------

def load_array(path: str | os.PathLike, what: str, numeric: bool = True, mmap: bool = False) -> Any:
    """A ``.npy`` file as an array; anything else (empty, not .npy, pickled objects, cut short, text/complex
    values where numbers are needed) is a one-line XmrError naming the file and the defect. NaN/inf and shapes
    are checked by the library call that uses the array (one message for CLI and Python callers).

    ``mmap=True`` maps the file copy-on-write instead of reading it: its pages come from the OS's file cache as
    they are first used, with no copy into fresh memory (for the 225 MB of COCO-5K DVSE embeddings, 0.5 s of
    single-threaded kernel time), and writes to the array stay in this process."""
    import numpy as np

    p = require_file(path, f"give the {what} as a .npy file")
    if p.is_dir():
        raise XmrError(f"{path}: is a directory; give the {what} as a .npy file")
    if p.stat().st_size == 0:
        raise XmrError(f"{path}: empty file (0 bytes); write the {what} with numpy.save")
    with open(p, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":  # np.load would try unpickling anything without the header
        kind = "a .npz/zip archive" if magic[:2] == b"PK" else "no NumPy .npy header (text or another format?)"
        raise XmrError(f"{path}: not a .npy file ({kind}); write the {what} with numpy.save")
    try:
        a = np.load(Path(path), allow_pickle=False, mmap_mode="c" if mmap else None)
    except ValueError as e:
        if "pickle" in str(e) or "Object arrays" in str(e) or "Python objects" in str(e):
            raise XmrError(f"{path}: holds pickled (object) data, not a numeric array; save the {what} as a "
                           f"plain numpy array") from None
        raise XmrError(f"{path}: cannot read {what} (cut short or damaged .npy: {e}); write it again") from None
    except (OSError, EOFError) as e:
        raise XmrError(f"{path}: cannot read {what} (cut short or damaged .npy: {e}); write it again") from None
    if numeric:
        if a.dtype.kind == "c":
            raise XmrError(f"{path}: the {what} holds complex numbers ({a.dtype}); give real values")
        if a.dtype.kind not in "biuf":
            raise XmrError(f"{path}: the {what} has dtype {a.dtype}; expected real numbers (float or int)")
    return a.view(np.ndarray) if mmap else a  # a plain array (the view keeps the mapping open)


# -- checkpoints: tensors and plain data only, so they load with torch.load(weights_only=True) ----------------

def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    with atomic_path(path, ".pt") as tmp:
        import torch

        torch.save(state, tmp)


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    import torch

    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: checkpoint not found; train the run first (`xmr train`)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling problem is a bad file for the user
        raise XmrError(f"{path}: cannot load checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from None
