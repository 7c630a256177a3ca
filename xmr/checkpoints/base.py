"""Published checkpoints of the reference implementations, read safely and mapped onto xmr's models.

A format (``xmr/checkpoints/<format>.py``) registers a :class:`CheckpointFormat` in :data:`CHECKPOINT_FORMATS`;
``xmr import-checkpoint --format NAME`` reads the official file with it and writes an ordinary run directory.
Official files are read without running pickle code: ``torch.load(weights_only=True)`` with the few globals a
format names allow-listed, and plain pickles (vocabularies) through :func:`load_plain_pickle`, which maps only
allow-listed classes onto inert stand-ins.
"""

from __future__ import annotations

import io
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from xmr.core.errors import XmrError
from xmr.core.registry import Registry


@dataclass
class ImportedModel:
    """What a format reads from an official checkpoint, in xmr's terms.

    ``method``: the xmr method (``METHODS`` name). ``config``: the run-config sections that the checkpoint fixes
    (nested dict, merged over the method's defaults and the recipe, e.g. ``{"model": {"embed_dim": 1024}}``).
    ``state_dict``: exactly the keys of xmr's model (loaded with ``strict=True``). ``image_dim``/``vocab_words``:
    as a trained run's ``best.pt`` holds them. ``provenance``: plain data recorded beside the run (epoch, the
    reference's options, criterion constants ...)."""

    method: str
    config: dict
    state_dict: dict[str, torch.Tensor]
    image_dim: int | None
    vocab_words: list[str] | None
    provenance: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointFormat:
    """One official checkpoint layout. ``read(src, vocab, options) -> ImportedModel``; ``options`` are the
    format's documented flags (e.g. PVSE's ``num_embeds``), given on the command line or in a recipe."""

    name: str
    read: Callable[[Path, Path | None, dict], ImportedModel]
    description: str = ""
    # where the paper's authors publish the weights (for `xmr doctor` and the error of a missing file)
    published_at: str = ""
    needs_vocab: bool = False
    # features.backbone of an import without a recipe (the features the released models were evaluated on)
    default_backbone: str = ""
    # the source is a folder (a save_pretrained model), not one file
    directory: bool = False


CHECKPOINT_FORMATS: Registry[CheckpointFormat] = Registry("checkpoint format")


class _Inert:
    """Stand-in for an allow-listed class of a plain pickle: keeps the pickled state as attributes, runs nothing."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


def _numpy_modules() -> tuple[Any, Any]:
    import numpy as np

    return np, (np._core if hasattr(np, "_core") else np.core).multiarray


def _checked_dtype(dtype: Any, what: str) -> Any:
    import numpy as np

    if not isinstance(dtype, np.dtype) or dtype.hasobject:
        raise pickle.UnpicklingError(f"refused {what} of dtype {dtype!r} (object arrays and scalars run code)")
    return dtype


def _numpy_scalar(dtype: Any, data: Any = None) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)`` for plain dtypes only; Python 2 byte strings arrive as latin-1
    text, which numpy turns back into bytes."""
    _, multiarray = _numpy_modules()
    return multiarray.scalar(_checked_dtype(dtype, "a numpy scalar"), data)


def _numpy_reconstruct(cls: Any, shape: Any, dtype_code: Any) -> Any:
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')``: an empty plain array; its ``BUILD`` state
    (dtype, shape, raw bytes) then fills it through :class:`_PlainArray`."""
    np, _ = _numpy_modules()
    if cls is not np.ndarray:
        raise pickle.UnpicklingError(f"refused numpy array class {cls!r}")
    return _PlainArray(0)


def _plain_array_class() -> type:
    np, _ = _numpy_modules()

    class PlainArray(np.ndarray):
        """An ndarray whose pickled state must hold a plain (non-object) dtype; becomes an ndarray after loading."""

        def __setstate__(self, state: Any) -> None:
            if not isinstance(state, tuple) or len(state) < 4:
                raise pickle.UnpicklingError("refused a numpy array state that is not (version, shape, dtype, ...)")
            _checked_dtype(state[-3], "a numpy array")
            super().__setstate__(state)

    return PlainArray


_PlainArray = _plain_array_class()


def old_pickle_globals() -> list[tuple[Any, str]]:
    """The one allow-list of the numpy objects that checkpoints of the 2018-2021 stacks pickle beside their tensors
    (e.g. PCME's ``metadata['scores']``): scalars, dtypes and plain arrays, under numpy 1's (``numpy.core``) and
    numpy 2's (``numpy._core``) names. Scalars and arrays of object dtype are refused (they would unpickle other
    objects); everything is turned into plain values by :func:`plain_values` after loading."""
    import numpy as np

    entries: list[tuple[Any, str]] = [(np.dtype, "numpy.dtype"), (np.ndarray, "numpy.ndarray"),
                                      (_PlainArray, f"{__name__}._PlainArray")]
    for core in ("numpy.core", "numpy._core"):
        entries += [(_numpy_scalar, f"{core}.multiarray.scalar"),
                    (_numpy_reconstruct, f"{core}.multiarray._reconstruct")]
    # BUILD (dtype.__setstate__) checks the instance's class: every concrete dtype class (numpy.dtypes.*)
    dtype_classes = {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGSUMmV"}
    entries += [(cls, f"{cls.__module__}.{cls.__qualname__}") for cls in dtype_classes]
    return entries


def plain_values(obj: Any) -> Any:
    """A loaded checkpoint with numpy scalars as Python numbers and numpy arrays as plain ``ndarray`` (containers and
    ``argparse.Namespace`` walked; tensors untouched)."""
    import argparse

    np, _ = _numpy_modules()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return np.array(obj)  # a plain ndarray (not the loader's subclass)
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            obj[k] = plain_values(v)
        return obj
    if isinstance(obj, list):
        obj[:] = [plain_values(v) for v in obj]
        return obj
    if isinstance(obj, tuple):
        return type(obj)(plain_values(v) for v in obj) if type(obj) is tuple else obj
    if isinstance(obj, argparse.Namespace):
        for k, v in vars(obj).items():
            setattr(obj, k, plain_values(v))
    return obj


def load_official(path: str | Path, allowed_globals: Iterable[Any] = ()) -> Any:
    """``torch.load`` of an official checkpoint with ``weights_only=True``: only tensors, plain containers, the numpy
    scalars/dtypes/arrays of :func:`old_pickle_globals` and the format's ``allowed_globals`` (e.g.
    ``argparse.Namespace``) are rebuilt; no other pickle code runs. Pre-zip (torch < 1.6) and zip containers,
    storages tagged ``cuda:N`` (read onto the CPU) and Python 2 pickles (``encoding="latin1"``) are read. Numpy
    values come back as plain values (:func:`plain_values`). Any failure is one :class:`XmrError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise XmrError(f"{path}: checkpoint not found; download it from the authors' release (docs/checkpoints.md)")
    last: Exception | None = None
    allowed = [*allowed_globals, *old_pickle_globals()]
    for kwargs in ({}, {"encoding": "latin1"}):
        try:
            with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
                # torch warns that `encoding` is ignored under weights_only, yet its weights-only unpickler decodes
                # Python 2 byte strings with it (tests/test_checkpoint_vsepp.py reads latin-1 bytes this way)
                warnings.filterwarnings("ignore", message="pickle_load_args only works")
                return plain_values(torch.load(path, map_location="cpu", weights_only=True, **kwargs))
        except Exception as e:  # noqa: BLE001 - retried with latin1, then reported in one line
            last = e
    msg = str(last).strip().splitlines()[0] if str(last).strip() else type(last).__name__
    refused = _refused_global(str(last))
    if refused:
        raise XmrError(f"{path}: refuses to load {refused} (not a tensor, a plain value or an allow-listed class of "
                       f"a released checkpoint); check the file is the official release for this --format")
    raise XmrError(f"{path}: not a readable checkpoint ({type(last).__name__}: {msg[:200]}); check the file is "
                   f"complete and is the official release for this --format")


def _refused_global(message: str) -> str:
    """The global torch's weights-only unpickler refused, from its message (``Unsupported global: GLOBAL a.b``)."""
    import re

    found = re.search(r"refused (a numpy \w+ of dtype [^ ]+)", message)
    if found:
        return found.group(1)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message) or \
        re.search(r"unrecognized function ([\w.<> ]+)", message) or \
        re.search(r"allowlisted via `add_safe_globals`, but got <class '([\w.]+)'>", message)
    return found.group(1).strip() if found else ""


def load_plain_pickle(path: str | Path, allowed_classes: Mapping[tuple[str, str], type] | Iterable[tuple[str, str]]
                      ) -> Any:
    """A plain (non-torch) pickle such as a reference vocabulary, Python 2 or 3, without running its code: the
    classes named in ``allowed_classes`` ((module, name) pairs, optionally mapped to a stand-in type) are rebuilt
    as inert objects holding their pickled state; any other global is refused with a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise XmrError(f"{path}: file not found")
    mapping = dict(allowed_classes) if isinstance(allowed_classes, Mapping) else {k: _Inert for k in allowed_classes}
    safe_builtins = {("builtins", n): getattr(__builtins__, n, None) if not isinstance(__builtins__, dict)
                     else __builtins__.get(n) for n in ("dict", "list", "set", "tuple", "object")}
    safe_builtins.update({("__builtin__", n[1]): v for n, v in safe_builtins.items()})
    safe_builtins.update({("copy_reg", "_reconstructor"): _reconstruct, ("copyreg", "_reconstructor"): _reconstruct})
    safe_builtins.update({tuple(name.rsplit(".", 1)): obj for obj, name in old_pickle_globals()})

    class _Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in mapping:
                return mapping[(module, name)]
            if (module, name) in safe_builtins and safe_builtins[(module, name)] is not None:
                return safe_builtins[(module, name)]
            raise XmrError(f"{path}: refuses to load {module}.{name} (not an allow-listed class of this format); "
                           f"is this the right file?")

    data = path.read_bytes()
    for encoding in ("ASCII", "latin1"):
        try:
            return plain_values(_Restricted(io.BytesIO(data), encoding=encoding).load())
        except XmrError:
            raise
        except UnicodeDecodeError:
            continue
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line
            raise XmrError(f"{path}: not a readable pickle ({type(e).__name__}: {e}); check the file") from None
    raise XmrError(f"{path}: cannot decode this pickle's strings")


def _reconstruct(cls: type, base: type, state: Any) -> Any:
    # copy_reg._reconstructor(cls, object, None) as Python 2 pickles old-style objects; cls is already allow-listed
    return object.__new__(cls) if base is object else base.__new__(cls, state)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop ``prefix`` from every key when every key has it (DataParallel's ``module.``); else unchanged."""
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def check_state_keys(expected: Iterable[str], got: Iterable[str], src: str | Path, hint: str = "") -> None:
    """Missing or unexpected keys are an error listing them (never ``strict=False``)."""
    expected, got = set(expected), set(got)
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_short(unexpected)}")
        raise XmrError(f"{src}: {'; '.join(parts)}{'; ' + hint if hint else ''}")


def _short(keys: list[str], n: int = 6) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def rename_keys(state: Mapping[str, torch.Tensor], rules: Iterable[tuple[str, str]], src: str | Path,
                unused: Iterable[str] = (), hint: str = "") -> dict[str, torch.Tensor]:
    """Map a reference state dict onto xmr's names: each key takes the first rule ``(ref_prefix, xmr_prefix)``
    whose prefix it starts with; keys starting with an ``unused`` prefix (built by the reference, never used in
    its forward) are dropped by name; any other key is an error listing them (:func:`check_state_keys`)."""
    rules, unused = list(rules), tuple(unused)
    out, unknown = {}, []
    for key, value in state.items():
        if unused and key.startswith(unused):
            continue
        for ref, ours in rules:
            if key.startswith(ref):
                out[ours + key[len(ref):]] = value
                break
        else:
            unknown.append(key)
    if unknown:
        check_state_keys([], unknown, src, hint)
    return out


def plain_data(obj: Any) -> Any:
    """``obj`` (e.g. an ``argparse.Namespace`` of the reference's options) as JSON-safe plain data."""
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        obj = vars(obj)
    if isinstance(obj, Mapping):
        return {str(k): plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_data(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if torch.is_tensor(obj) and obj.numel() == 1:
        return obj.item()
    return str(obj)


def map_encoders(img: Mapping[str, torch.Tensor], txt: Mapping[str, torch.Tensor], expected: tuple[list, list],
                 rules: tuple[list, list], src: str | Path, hint: str = "", unused: Iterable[str] = ()
                 ) -> dict[str, torch.Tensor]:
    """A ``[img_enc, txt_enc]`` pair of reference states (VSE++/VSE∞ containers) checked against the reference's
    ``expected`` key lists (errors name ``img_enc.``/``txt_enc.`` keys) and renamed by ``rules`` into one xmr state
    dict; ``unused``: image-encoder key prefixes the reference builds but never uses."""
    check_state_keys([f"img_enc.{k}" for k in expected[0]] + [f"txt_enc.{k}" for k in expected[1]],
                     [f"img_enc.{k}" for k in img] + [f"txt_enc.{k}" for k in txt], src, hint)
    state = rename_keys(img, rules[0], src, unused=unused, hint=hint)
    state.update(rename_keys(txt, rules[1], src, hint=hint))
    return state
