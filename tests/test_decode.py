"""The device decoder (xmr/features/decode.py): which files go to PIL, and what the device path produces.

The device path runs here with ``device="cpu"`` (torchvision's libjpeg-turbo decoder behind the same call that
uses nvJPEG on CUDA), so the batching, the fallback rules, the resize and the ordering are tested without a GPU.
"""

import io
import json
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SAMPLE_PHOTOS
from xmr.core.errors import XmrError
from xmr.data import load_split
from xmr.features.decode import (EncodedImageDataset, decode_batch, device_fallback_reason, resize_image,
                                 resize_tensor, resolve_decoder)
from xmr.features.extract import extract_features
from xmr.features.store import FeatureFile



pytestmark = pytest.mark.usefixtures("one_thread")


def _jpeg(mode: str = "RGB", **save) -> bytes:
    buf = io.BytesIO()
    Image.open(SAMPLE_PHOTOS / "flower.jpg").convert(mode).resize((160, 107)).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _header(sof: int, precision: int = 8, components: int = 3) -> bytes:
    """SOI, a frame header with marker ``sof`` and an empty scan, then EOI: enough for the header rules."""
    comps = b"".join(bytes([i + 1, 0x11, 0]) for i in range(components))
    frame = struct.pack(">BHHB", precision, 16, 16, components) + comps
    scan = struct.pack(">B", 1) + bytes([1, 0]) + bytes([0, 63, 0])
    return (b"\xff\xd8" + bytes([0xFF, sof]) + struct.pack(">H", 2 + len(frame)) + frame
            + b"\xff\xda" + struct.pack(">H", 2 + len(scan)) + scan + b"\x00" * 8 + b"\xff\xd9")


def test_fallback_rules_on_real_encoder_output():
    assert device_fallback_reason(_jpeg()) is None                        # baseline, 3 components
    assert device_fallback_reason(_jpeg("L")) is None                     # grayscale: 1 component
    assert device_fallback_reason(_jpeg("CMYK")) == "4 components (CMYK/YCCK)"
    assert device_fallback_reason(_jpeg(progressive=True)) == "progressive JPEG"
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    assert device_fallback_reason(png.getvalue()) == "not a JPEG"
    data = _jpeg()
    assert device_fallback_reason(data[: len(data) // 2]) == "truncated"   # scan cut: no end-of-image marker
    assert device_fallback_reason(data[:40]) == "truncated"                # cut inside the header
    assert device_fallback_reason(b"\xff\xd8\x00\x00 junk") == "malformed JPEG header"


def test_fallback_rules_on_frame_types_by_hand():
    assert device_fallback_reason(_header(0xC0)) is None
    assert device_fallback_reason(_header(0xC1)) is None                 # extended sequential, 8-bit Huffman
    assert device_fallback_reason(_header(0xC3)) == "lossless JPEG"
    assert device_fallback_reason(_header(0xC5)) == "hierarchical JPEG"
    assert device_fallback_reason(_header(0xC9)) == "arithmetic-coded JPEG"
    assert device_fallback_reason(_header(0xC1, precision=12)) == "12-bit JPEG"
    assert device_fallback_reason(_header(0xC0, components=2)) == "2 components"
    no_frame = b"\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00\xff\xd9"
    assert device_fallback_reason(no_frame) == "malformed JPEG header (no frame)"


def test_resolve_decoder():
    assert resolve_decoder("auto", torch.device("cpu")) == "pil"
    assert resolve_decoder("auto", torch.device("cuda")) == "device"
    assert resolve_decoder("device", torch.device("cpu")) == "device"
    with pytest.raises(XmrError, match="decoder: 'nvjpeg'; choose one of auto, pil, device"):
        resolve_decoder("nvjpeg", torch.device("cpu"))


@pytest.mark.parametrize("resize,size", [("squash", 96), ("center_crop", 64), ("shorter_side", 48)])
def test_device_resize_follows_pil_within_one_grey_level(resize, size):
    """PIL's BILINEAR resize is an antialiased (area-scaled) triangle filter; torch's bilinear with
    antialias=True is the same filter, so the two agree to rounding: at most 1 level apart."""
    with Image.open(SAMPLE_PHOTOS / "china.jpg") as im:
        ref, g_ref = resize_image(im.convert("RGB"), size, resize, max_size=80)
    decoded = torch.from_numpy(np.asarray(Image.open(SAMPLE_PHOTOS / "china.jpg").convert("RGB")).copy()).permute(2, 0, 1)
    x, g = resize_tensor(decoded, size, resize, max_size=80)
    assert x.shape == ref.shape and x.dtype == torch.uint8
    assert torch.equal(g, g_ref)
    diff = (x.int() - ref.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.2


def _files(tmp_path) -> list[Path]:
    """Four files, two of which the device decoder does not take (CMYK, PNG)."""
    (tmp_path / "img").mkdir(exist_ok=True)
    paths = []
    for name, data in [("a.jpg", _jpeg()), ("cmyk.jpg", _jpeg("CMYK")), ("g.jpg", _jpeg("L"))]:
        (tmp_path / "img" / name).write_bytes(data)
        paths.append(tmp_path / "img" / name)
    Image.open(SAMPLE_PHOTOS / "china.jpg").convert("RGB").resize((120, 80)).save(tmp_path / "img" / "p.png")
    return paths + [tmp_path / "img" / "p.png"]


def test_decode_batch_keeps_order_and_matches_the_pil_path(tmp_path):
    paths = _files(tmp_path)
    ds = EncodedImageDataset(paths, 64)
    items = [ds[i] for i in range(len(ds))]
    assert [k for k, _, _ in items] == ["bytes", "pixels", "bytes", "pixels"]
    reasons = Counter()
    out = decode_batch(items, paths, torch.device("cpu"), 64, reasons=reasons)
    assert reasons == Counter({"4 components (CMYK/YCCK)": 1, "not a JPEG": 1})
    for p, (x, g) in zip(paths, out):
        with Image.open(p) as im:
            ref, g_ref = resize_image(im.convert("RGB"), 64)
        assert x.shape == (3, 64, 64) and torch.equal(g, g_ref)
        assert (x.int() - ref.int()).abs().max() <= 1, p.name   # same JPEG decoder on CPU: resize rounding only


def _split(tmp_path, names):
    images = [{"filename": f, "imgid": i, "split": "test", "sentences": [{"raw": "x"}]} for i, f in enumerate(names)]
    (tmp_path / "d.json").write_text(json.dumps({"images": images}))
    return load_split({"name": "d", "format": "karpathy", "annotations": str(tmp_path / "d.json"),
                       "images": str(tmp_path / "img"), "captions_per_image": 1}, "test")


def test_extract_with_the_device_decoder_matches_pil_features(tmp_path, capfd):
    paths = _files(tmp_path)
    split = _split(tmp_path, [p.name for p in paths])
    feats = {}
    for decoder in ("pil", "device"):
        bb = {"name": "efficientnet_lite0", "key": "e", "input_size": 64, "decoder": decoder}
        out = extract_features(split, bb, tmp_path / f"{decoder}.h5", batch_size=3, workers=1, progress=False)
        f = FeatureFile(out)
        assert f.attrs["decoder"] == decoder
        feats[decoder] = np.stack([f[i] for i in range(len(paths))])
    assert "decoder: 2 of 4 images decoded with PIL instead of on the device" in capfd.readouterr().err
    a, b = feats["pil"], feats["device"]
    # the files that went to PIL give identical features; inputs within one grey level give features within
    # 5 % (Frobenius) whose pooled vectors keep a cosine > 0.999 (a.jpg and cmyk.jpg, one photo encoded twice,
    # are further apart than that: 0.995)
    assert np.array_equal(a[[1, 3]], b[[1, 3]])
    assert (np.linalg.norm(a - b, axis=(1, 2)) / np.linalg.norm(a, axis=(1, 2))).max() < 0.05
    pa, pb = a.mean(1), b.mean(1)
    cos = (pa * pb).sum(1) / np.linalg.norm(pa, axis=1) / np.linalg.norm(pb, axis=1)
    assert cos.min() > 0.999


def test_truncated_file_is_the_same_clear_error_with_the_device_decoder(tmp_path):
    _files(tmp_path)
    data = _jpeg()
    (tmp_path / "img" / "cut.jpg").write_bytes(data[: len(data) // 2])
    split = _split(tmp_path, ["a.jpg", "cut.jpg"])
    bb = {"name": "efficientnet_lite0", "key": "e", "input_size": 64, "decoder": "device"}
    with pytest.raises(XmrError) as e:
        extract_features(split, bb, tmp_path / "f.h5", batch_size=2, workers=1, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'img' / 'cut.jpg'}: cannot read image") and "\n" not in msg
    assert not (tmp_path / "f.h5").exists()


def test_a_partial_extraction_is_not_resumed_with_the_other_decoder(tmp_path):
    """A run that stopped after its first shard (here: a truncated file in the second batch) keeps the shard;
    resuming it with the other decoder would mix inputs from two decoders, so it is refused."""
    _files(tmp_path)
    data = _jpeg()
    (tmp_path / "img" / "cut.jpg").write_bytes(data[: len(data) // 2])
    split = _split(tmp_path, ["a.jpg", "g.jpg", "cut.jpg"])
    bb = {"name": "efficientnet_lite0", "key": "e", "input_size": 64, "decoder": "pil"}
    with pytest.raises(XmrError, match="cut.jpg: cannot read image"):
        extract_features(split, bb, tmp_path / "f.h5", batch_size=2, workers=0, progress=False)
    assert len(list((tmp_path / "f.h5.parts").glob("*.npz"))) == 2   # the settings stamp and the first shard
    with pytest.raises(XmrError, match=r"partial extraction was made with different settings.*'decoder'"):
        extract_features(split, {**bb, "decoder": "device"}, tmp_path / "f.h5", batch_size=2, workers=0,
                         progress=False)


def _without_segment(data: bytes, marker: int) -> bytes:
    """``data`` with every header segment of ``marker`` (e.g. 0xDB: quantisation tables) cut out."""
    out, pos = bytearray(data[:2]), 2
    while data[pos + 1] != 0xDA:
        length = struct.unpack(">H", data[pos + 2: pos + 4])[0]
        if data[pos + 1] != marker:
            out += data[pos: pos + 2 + length]
        pos += 2 + length
    return bytes(out + data[pos:])


def test_a_file_the_device_decoder_rejects_goes_to_pil(tmp_path, monkeypatch):
    """nvJPEG may reject a file that passed the header rules: the batch call fails, each file is retried alone,
    and the one still rejected is decoded by PIL (here the rejection is injected for p.jpg)."""
    import torchvision.io

    paths = []
    for name in ("a.jpg", "p.jpg", "g.jpg"):
        (tmp_path / name).write_bytes(_jpeg("L" if name == "g.jpg" else "RGB"))
        paths.append(tmp_path / name)
    ds = EncodedImageDataset(paths, 32)
    items = [ds[i] for i in range(3)]
    real = torchvision.io.decode_jpeg
    rejected = items[1][1]

    def picky(data, **kw):
        if isinstance(data, list) and any(d is rejected for d in data) or data is rejected:
            raise RuntimeError("nvjpeg: unsupported")
        return real(data, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", picky)
    reasons = Counter()
    out = decode_batch(items, paths, torch.device("cpu"), 32, reasons=reasons)
    assert reasons == Counter({"rejected by the device decoder": 1})
    with Image.open(paths[1]) as im:
        assert torch.equal(out[1][0], resize_image(im.convert("RGB"), 32)[0])   # PIL's own output, bit for bit
    assert all(x.shape == (3, 32, 32) for x, _ in out)


def test_a_file_neither_decoder_reads_is_one_clear_error(tmp_path):
    """Header rules pass (baseline, 3 components, end marker) but the quantisation tables are missing: the
    device decoder fails, PIL fails too, and the error names the file."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(_jpeg())
    bad = _without_segment(_jpeg(), 0xDB)
    assert device_fallback_reason(bad) is None
    (tmp_path / "img" / "noq.jpg").write_bytes(bad)
    split = _split(tmp_path, ["a.jpg", "noq.jpg"])
    bb = {"name": "efficientnet_lite0", "key": "e", "input_size": 64, "decoder": "device"}
    with pytest.raises(XmrError) as e:
        extract_features(split, bb, tmp_path / "f.h5", batch_size=2, workers=0, progress=False)
    assert str(e.value).startswith(f"{tmp_path / 'img' / 'noq.jpg'}: cannot read image") and "\n" not in str(e.value)
    assert not (tmp_path / "f.h5").exists()
