"""Fault suite (docs/faults.md): each test injects one fault and checks what the user gets: a one-line error
naming the file/key and what to do, a non-zero exit, no traceback, and nothing half-written."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from xmr.cli import main
from xmr.run.config import load_run_config
from xmr.core.errors import XmrError
from xmr.core.io import load_checkpoint
from xmr.train.trainer import train

from conftest import run_xmr

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_xmr(*args)


def _one_line_error(text: str, command: str) -> str:
    """The single stderr line of a failed command (asserts it is one line without a traceback)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    assert lines[0].startswith(f"xmr {command}: error: "), text
    return lines[0]


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- training: best.pt, last.pt, output directory, disk, device -------------------------------------------------

def test_best_pt_restored_after_kill_deleted_it(tiny_synth, tmp_path):
    """The issue's case: a finished one-epoch run loses best.pt and train.json (Snakemake deletes the outputs of
    a killed job); the rerun must put back best.pt with the very same weights, not end without it."""
    recipe = tiny_synth.recipe("vsepp", name="vsepp_best", train={"epochs": 1})
    out = tmp_path / "run"
    train(load_run_config(recipe), out, progress=False)
    original = load_checkpoint(out / "best.pt")
    (out / "best.pt").unlink()
    (out / "train.json").unlink()
    r = _cli("train", "--config", str(recipe), "--out-dir", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert f"restored {out / 'best.pt'} (epoch 1)" in r.stdout
    restored = load_checkpoint(out / "best.pt")
    assert restored.keys() == original.keys()
    assert _same_state(restored["model"], original["model"])
    assert {k: restored[k] for k in ("vocab_words", "image_dim", "epoch", "best_rsum")} == \
        {k: original[k] for k in ("vocab_words", "image_dim", "epoch", "best_rsum")}
    assert (out / "train.json").exists()


def test_best_pt_restored_when_the_best_epoch_was_not_the_last(tiny_synth, tmp_path):
    """A plateau: epoch 2 does not beat epoch 1 (lr 1e-30 leaves the weights as they are, so RSUM ties), so
    last.pt holds epoch 2's weights and best.pt epoch 1's; after losing best.pt the rerun rebuilds epoch 1's."""
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_plateau", train={"epochs": 2},
                                            optim={"lr": 1e-30}))
    out = tmp_path / "run"
    summary = train(cfg, out, progress=False)
    assert summary["best_epoch"] == 1  # the tie keeps the first epoch
    original = load_checkpoint(out / "best.pt")
    last = load_checkpoint(out / "last.pt")
    assert last["epoch"] == 1 and "best_model" in last
    (out / "best.pt").unlink()
    train(cfg, out, progress=False)
    restored = load_checkpoint(out / "best.pt")
    assert restored["epoch"] == original["epoch"] == 0
    assert _same_state(restored["model"], original["model"])


def test_truncated_last_pt_on_resume_says_what_to_do(tiny_synth, tmp_path):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_trunc", train={"epochs": 1})
    out = tmp_path / "run"
    train(load_run_config(recipe), out, progress=False)
    data = (out / "last.pt").read_bytes()
    (out / "last.pt").write_bytes(data[: len(data) // 2])
    r = _cli("train", "--config", str(recipe), "--out-dir", str(out), "--no-progress")
    assert r.returncode == 2
    line = _one_line_error(r.stderr, "train")
    assert str(out / "last.pt") in line and "rerun with --no-resume to start over, or delete it" in line
    # and the advice works
    train(load_run_config(recipe), out, resume=False, progress=False)
    assert load_checkpoint(out / "last.pt")["epoch"] == 0


@contextlib.contextmanager
def _read_only(path: Path):
    """Make ``path`` unwritable: mode 0555, plus the immutable flag for root (who ignores modes)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    immutable = os.geteuid() == 0 and shutil.which("chattr") is not None and \
        subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    try:
        probe = path / "probe"
        try:
            probe.write_text("x")
            probe.unlink()
            pytest.skip("cannot make a directory read-only here (root without chattr)")
        except OSError:
            pass
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_read_only_output_directory_fails_first_in_one_line(tiny_synth, tmp_path):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_ro", train={"epochs": 1})
    with _read_only(tmp_path / "locked") as locked:
        r = _cli("train", "--config", str(recipe), "--out-dir", str(locked / "run"), "--no-progress")
        assert r.returncode == 2
        line = _one_line_error(r.stderr, "train")
        assert str(locked / "run") in line and "is not writable" in line
        assert r.stdout == ""  # nothing started (no "resuming", no epoch line)
        assert list(locked.iterdir()) == []


def test_disk_full_during_checkpoint_write(tiny_synth, tmp_path, monkeypatch):
    """ENOSPC while last.pt is written (2nd atomic write: config.yaml is the 1st): one-line error, no partial
    last.pt and no temporary file left, and an earlier last.pt stays intact."""
    import xmr.core.io

    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_enospc", train={"epochs": 2}))
    out = tmp_path / "run"
    monkeypatch.setenv("XMR_FAULT", "enospc_at:write:2")
    monkeypatch.setattr(xmr.core.io, "_FAULT_COUNTS", {})
    with pytest.raises(XmrError, match=r"last\.pt: disk full or quota exceeded while writing it \(No space left "
                                       r"on device\); nothing was replaced"):
        train(cfg, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "progress.json"]  # progress.json: from the first step
    # a fresh run: config.yaml, then epoch 1's last.pt, best.pt, history.csv, then epoch 2's last.pt (5th write)
    # fails: epoch 1's last.pt must survive unchanged
    out = tmp_path / "run2"
    monkeypatch.setenv("XMR_FAULT", "enospc_at:write:5")
    monkeypatch.setattr(xmr.core.io, "_FAULT_COUNTS", {})
    with pytest.raises(XmrError, match="disk full"):
        train(cfg, out, progress=False)
    ck = load_checkpoint(out / "last.pt")
    assert ck["epoch"] == 0 and len(ck["history"]) == 1
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_gpu_requested_but_absent(tiny_synth, tmp_path, capsys):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_gpu", train={"epochs": 1, "device": "cuda"})
    rc = main(["train", "--config", str(recipe), "--out-dir", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    line = _one_line_error(capsys.readouterr().err, "train")
    assert "device 'cuda' requested, but no CUDA GPU is visible" in line
    assert not (tmp_path / "run").exists()  # failed before creating anything


# --- evaluate / similarity inputs ------------------------------------------------------------------------------

GOOD = np.eye(2, 4, dtype=np.float32)  # 2 images x 2 captions each (used with --captions-per-image 2)


def _write_bad(path: Path, case: str) -> None:
    if case == "empty":
        path.write_bytes(b"")
    elif case == "text":
        path.write_text("0.1 0.2\n0.3 0.4\n")
    elif case == "npz":
        np.savez(path.with_suffix(".npz"), a=GOOD)
        path.with_suffix(".npz").rename(path)
    elif case == "strings":
        np.save(path, np.array([["a", "b", "c", "d"], ["e", "f", "g", "h"]]))
    elif case == "objects":
        np.save(path, np.array([[1, "b", None, 2.0]] * 2, dtype=object), allow_pickle=True)
    elif case == "complex":
        np.save(path, GOOD.astype(np.complex64) + 1j)
    elif case == "truncated":
        np.save(path, np.ones((50, 100), np.float32))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "3d":
        np.save(path, np.ones((2, 4, 1), np.float32))
    elif case == "shape":
        np.save(path, np.ones((3, 4), np.float32))  # 4 captions at 2 per image = 2 images, not 3
    elif case in ("nan", "inf", "-inf"):
        a = GOOD.copy()
        a[1, 3] = float(case)
        np.save(path, a)
    else:
        raise AssertionError(case)


EVAL_CASES = {
    "empty": "empty file (0 bytes)",
    "text": "not a .npy file (no NumPy .npy header (text or another format?))",
    "npz": "not a .npy file (a .npz/zip archive)",
    "strings": "has dtype <U1; expected real numbers",
    "objects": "holds pickled (object) data",
    "complex": "holds complex numbers (complex64)",
    "truncated": "cut short or damaged .npy",
    "3d": "similarity matrix must be 2-D (images x captions), got shape (2, 4, 1)",
    "shape": "4 captions with 2 per image make 2 images, but the matrix has 3 image rows",
    "nan": "similarity matrix contains 1 NaN and 0 inf value(s) (first at row 1, column 3)",
    "inf": "similarity matrix contains 0 NaN and 1 inf value(s) (first at row 1, column 3)",
    "-inf": "similarity matrix contains 0 NaN and 1 inf value(s) (first at row 1, column 3)",
}


@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_evaluate_bad_sims_file(tmp_path, capsys, case):
    sims = tmp_path / "S.npy"
    _write_bad(sims, case)
    rc = main(["evaluate", "--sims", str(sims), "--captions-per-image", "2", "--out", str(tmp_path / "M.json")])
    line = _one_line_error(capsys.readouterr().err, "evaluate")
    assert rc == 2 and EVAL_CASES[case] in line, line
    assert "pickled" not in line or case == "objects"  # a text file is not "pickled data"
    assert not (tmp_path / "M.json").exists() and list(tmp_path.iterdir()) == [sims]


def test_evaluate_text_file_as_npy_subprocess(tmp_path):
    sims = tmp_path / "S.npy"
    _write_bad(sims, "text")
    r = _cli("evaluate", "--sims", str(sims), "--out", str(tmp_path / "M.json"))
    assert r.returncode == 2
    assert _one_line_error(r.stderr, "evaluate") == (
        f"xmr evaluate: error: {sims}: not a .npy file (no NumPy .npy header (text or another format?)); write the "
        f"similarity matrix with numpy.save")
    assert not (tmp_path / "M.json").exists()


SIM_CASES = {**{k: EVAL_CASES[k] for k in ("empty", "text", "npz", "strings", "objects", "complex", "truncated")},
             "nan": "image embeddings contain 1 NaN or inf value(s)",
             "inf": "image embeddings contain 1 NaN or inf value(s)",
             "4d": "images must be (n, D) or (n, set size, D), got shape (2, 1, 1, 4)"}


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_similarity_bad_embeddings_file(tmp_path, capsys, case):
    images, captions = tmp_path / "I.npy", tmp_path / "C.npy"
    np.save(captions, np.ones((4, 4), np.float32))
    if case == "4d":
        np.save(images, np.ones((2, 1, 1, 4), np.float32))
    else:
        _write_bad(images, case)
    rc = main(["similarity", "--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "S.npy")])
    line = _one_line_error(capsys.readouterr().err, "similarity")
    assert rc == 2 and SIM_CASES[case] in line, line
    assert not (tmp_path / "S.npy").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --- feature extraction and import -----------------------------------------------------------------------------

def _tiny_split(tmp_path, n=4):
    from xmr.config.loader import load_backbone_config, load_dataset_config
    from xmr.data import load_split

    from conftest import tiny_extraction_config

    cfg_dir = tiny_extraction_config(tmp_path, n, input_size=32, batch_size=n)
    return load_split(load_dataset_config("synth", cfg_dir), "train"), load_backbone_config("eff", cfg_dir)


def test_truncated_jpeg_leaves_no_parts_folder(tmp_path):
    from PIL import Image

    from xmr.features.extract import extract_features

    split, bcfg = _tiny_split(tmp_path)
    bad = Path(split.image_paths[0])
    buf = io.BytesIO()
    Image.open(bad).convert("RGB").resize((64, 64)).save(buf, format="JPEG")
    bad.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    out = tmp_path / "features" / "train.h5"
    truncated = r"\((Truncated File Read|image file is truncated)"  # PIL's wording depends on where the cut is
    with pytest.raises(XmrError, match=rf"{bad.name}: cannot read image {truncated}"):
        extract_features(split, bcfg, out, batch_size=4, workers=0, progress=False)
    assert not out.exists() and not out.with_name("train.h5.parts").exists()
    assert list(out.parent.iterdir()) == []


def test_rejected_butd_tsv_leaves_no_parts_folder(tmp_path):
    from xmr.features.importers import import_butd_tsv

    tsv = tmp_path / "bad.tsv"
    tsv.write_text("1\t10\t10\t1\tAAAA\n")  # 5 columns, a BUTD TSV has 6 or 10
    out = tmp_path / "features" / "train.h5"
    with pytest.raises(XmrError, match=r"bad\.tsv:1: 5 tab-separated columns"):
        import_butd_tsv([tsv], out, progress=False)
    assert not out.exists() and not out.with_name("train.h5.parts").exists()


def test_stale_assembly_temp_file_removed_by_rerun(tmp_path):
    """What a kill during assembly leaves (atomic_path's `.train.h5.XXXX.h5` beside the store) goes away when
    the extraction runs again (the kill itself is in tests/test_kill_points.py)."""
    from xmr.features.extract import extract_features

    split, bcfg = _tiny_split(tmp_path)
    out = tmp_path / "features" / "train.h5"
    out.parent.mkdir(parents=True)
    stale = out.parent / ".train.h5.k1ll3d.h5"
    stale.write_bytes(b"\x89HDF half a store")
    other = out.parent / ".val.h5.k1ll3d.h5"  # another split's: not this run's business
    other.write_bytes(b"x")
    extract_features(split, bcfg, out, batch_size=4, workers=0, progress=False)
    assert out.exists() and not stale.exists() and other.exists()


# --- corrupt files a reader opens ----------------------------------------------------------------------------

def test_checkpoint_cut_in_half_is_one_line(tiny_synth, tmp_path, capsys):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_cut", train={"epochs": 1})
    out = tmp_path / "run"
    train(load_run_config(recipe), out, progress=False)
    capsys.readouterr()  # the training's own per-epoch log lines
    data = (out / "best.pt").read_bytes()
    (out / "best.pt").write_bytes(data[: len(data) // 2])
    rc = main(["score", "--run", str(out), "--out", str(tmp_path / "S.npy")])
    line = _one_line_error(capsys.readouterr().err, "score")
    assert rc == 2 and f"{out / 'best.pt'}: cannot load checkpoint" in line
    assert not (tmp_path / "S.npy").exists()


def test_feature_store_cut_in_half_or_missing_a_dataset(tiny_synth, tmp_path):
    import h5py

    from xmr.features.store import FeatureFile

    src = tiny_synth.features_dir / "synth" / "efficientnet_lite0" / "val.h5"
    cut = tmp_path / "cut.h5"
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(XmrError, match=rf"{cut}: cannot read HDF5 .*; delete it and re-extract"):
        FeatureFile(cut)
    partial = tmp_path / "partial.h5"
    with h5py.File(partial, "w") as f:
        f.create_dataset("features", data=np.zeros((2, 3, 4), np.float32))
        f.create_dataset("image_ids", data=np.array(["a", "b"], dtype=object), dtype=h5py.string_dtype())
    with pytest.raises(XmrError, match=rf"{partial}: not an xmr feature file \(no 'num_regions' dataset\)"):
        FeatureFile(partial)


def test_yaml_syntax_error_is_one_line(tmp_path, capsys):
    bad = tmp_path / "recipe.yaml"
    bad.write_text("method: vsepp\ntrain: {epochs: 2\n")
    rc = main(["train", "--config", str(bad), "--out-dir", str(tmp_path / "run")])
    line = _one_line_error(capsys.readouterr().err, "train")
    assert rc == 2 and f"{bad}: invalid YAML (line 3)" in line
    assert not (tmp_path / "run").exists()


def test_sqlite_locked_writes_are_retried_with_back_off():
    """What a shared mlflow.db answers under load; the tracker's writes go through retry_locked."""
    from xmr.run.tracking import retry_locked

    calls = []

    def flaky(x, times):
        calls.append(x)
        if len(calls) <= times:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return x * 2

    assert retry_locked(flaky, 21, times=3, first_wait=0.0) == 42 and len(calls) == 4
    calls.clear()
    with pytest.raises(RuntimeError, match="database is locked"):
        retry_locked(flaky, 1, times=99, attempts=5, first_wait=0.0)
    assert len(calls) == 5  # gives up after `attempts`
    calls.clear()

    def broken():
        calls.append(1)
        raise ValueError("no such table: metrics")

    with pytest.raises(ValueError):
        retry_locked(broken, first_wait=0.0)
    assert len(calls) == 1  # other errors are not retried


def test_read_only_feature_directory_fails_before_the_backbone_loads(tmp_path, monkeypatch):
    import xmr.features.extract as extract

    split, bcfg = _tiny_split(tmp_path)
    loaded = []
    monkeypatch.setattr(extract, "build_backbone", lambda cfg: loaded.append(cfg))  # must not be reached
    with _read_only(tmp_path / "locked") as locked:
        with pytest.raises(XmrError, match=rf"{locked}: feature output directory is not writable"):
            extract.extract_features(split, bcfg, locked / "train.h5", batch_size=4, workers=0, progress=False)
        assert list(locked.iterdir()) == []
    assert loaded == []


def test_slurm_job_on_sqlite_is_told_to_use_the_server(tmp_path):
    from xmr.run.tracking import shared_sqlite_note

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    note = shared_sqlite_note(uri, {"SLURM_JOB_ID": "4242"})
    assert note.startswith(f"note: SLURM job 4242 logs to the SQLite file {tmp_path / 'mlflow.db'};")
    assert "`xmr mlflow-server`" in note and "MLFLOW_TRACKING_URI" in note
    assert shared_sqlite_note(uri, {}) is None  # not a cluster job: SQLite is fine
    assert shared_sqlite_note("http://login1:5000", {"SLURM_JOB_ID": "4242"}) is None


def test_disk_full_during_a_feature_shard_write(tmp_path, monkeypatch):
    """ENOSPC on the first shard (write 2; the settings stamp is write 1): one-line error, no store, no shard,
    no temporary file; the folder with only the stamp is gone too."""
    import xmr.core.io
    from xmr.features.extract import extract_features

    split, bcfg = _tiny_split(tmp_path)
    out = tmp_path / "features" / "train.h5"
    monkeypatch.setenv("XMR_FAULT", "enospc_at:write:2")
    monkeypatch.setattr(xmr.core.io, "_FAULT_COUNTS", {})
    with pytest.raises(XmrError, match=r"000000000\.npz: disk full or quota exceeded while writing it"):
        extract_features(split, bcfg, out, batch_size=4, workers=0, progress=False)
    assert list(out.parent.iterdir()) == []


def test_cluster_submission_with_sqlite_tracking_warns():
    from xmr.run.tracking import cluster_sqlite_warning

    msg = cluster_sqlite_warning(True, "sqlite:///mlflow.db")
    assert msg and "mlflow.db" in msg and "xmr mlflow-server" in msg and "MLFLOW_TRACKING_URI" in msg
    assert cluster_sqlite_warning(True, "http://127.0.0.1:5000") is None  # a server: fine
    assert cluster_sqlite_warning(False, "sqlite:///mlflow.db") is None   # local jobs: one process at a time


def test_a_run_lands_in_its_experiment_when_another_process_created_it_first(tmp_path, monkeypatch):
    # a server has no lock between machines: this job looked the experiment up before another job created it, so
    # its own create fails (RESOURCE_ALREADY_EXISTS); the run must still go to that experiment, not to Default
    # (with MLflow's set_experiment, 8 concurrent trainings on a server lost 3 runs to Default)
    import mlflow

    import xmr.run.tracking as tracking
    from xmr.run.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker(True)
    exp_id = mlflow.MlflowClient().create_experiment("xmr/race", artifact_location=str(tmp_path / "mlruns"))
    monkeypatch.setattr(tracking, "sqlite_path", lambda uri: None)  # the server's path: no lock, MLflow creates
    real_get, looked = mlflow.MlflowClient.get_experiment_by_name, []

    def first_look_misses(self, name):
        looked.append(name)
        return None if len(looked) == 1 else real_get(self, name)

    monkeypatch.setattr(mlflow.MlflowClient, "get_experiment_by_name", first_look_misses)
    with tracker.run("xmr/race", "r0"):
        run_id = tracker.run_id
    assert looked == ["xmr/race", "xmr/race"]  # missed, lost the create, looked again
    assert mlflow.MlflowClient().get_run(run_id).info.experiment_id == exp_id


def test_reopening_a_stored_run_takes_no_first_use_lock(tmp_path, monkeypatch):
    # the evaluations of one run (`xmr test`, one per re-ranker) reopen it by id side by side: they need neither
    # its experiment nor the lock that serialises a new store's creation, so they do not queue on each other
    import mlflow

    import xmr.run.tracking as tracking
    from xmr.run.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker(True)
    with tracker.run("xmr/reopen", "r0"):
        run_id = tracker.run_id
    taken, real = [], tracking.store_lock
    monkeypatch.setattr(tracking, "store_lock", lambda uri: taken.append(uri) or real(uri))
    with tracker.run("xmr/reopen", "r0", run_id=run_id):
        tracker.log_metrics({"test_plain/plain/rsum": 250.0})
    assert taken == []
    assert mlflow.MlflowClient().get_run(run_id).data.metrics["test_plain/plain/rsum"] == 250.0
    # a run id and no store yet (the database was removed): the store is created under the lock, and MLflow then
    # reports the unknown run as before
    new_uri = f"sqlite:///{tmp_path / 'new.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_uri)
    with pytest.raises(mlflow.exceptions.MlflowException, match=run_id):
        with Tracker(True).run("xmr/reopen", "r0", run_id=run_id):
            pass
    assert taken == [new_uri]


def test_a_new_sqlite_store_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    # xmr.run.tracking.create_sqlite_store builds the store elsewhere (memory-backed scratch space) and moves it
    # into place: migrations that fail leave neither the database nor a temporary file beside it
    import mlflow

    from xmr.run import tracking

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    made = []  # the scratch folders the builds used (other tests may build stores meanwhile: only these count)
    real_tmpdir = tracking.tempfile.TemporaryDirectory

    def tmpdir(*a, **k):
        made.append(real_tmpdir(*a, **k))
        return made[-1]

    monkeypatch.setattr(tracking.tempfile, "TemporaryDirectory", tmpdir)

    real_store = tracking._sqlite_store

    def fail(*a, **k):  # the schema migrated in scratch space, then the job is killed
        real_store(*a, **k).engine.dispose()
        raise RuntimeError("killed while migrating")

    with monkeypatch.context() as m:
        m.setattr(tracking, "_sqlite_store", fail)
        with pytest.raises(RuntimeError, match="killed while migrating"):
            with tracking.store_lock(f"sqlite:///{db}"):
                pass
    assert list(db.parent.iterdir()) == []
    assert made and not any(Path(t.name).exists() for t in made)  # nor a scratch folder
    # a completed store keeps its experiments' artifacts beside itself, not under the working directory
    monkeypatch.chdir(tmp_path)
    with tracking.store_lock(f"sqlite:///{db}"):
        assert db.is_file()
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]
    assert not any(Path(t.name).exists() for t in made)
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    default = client.get_experiment("0")
    assert (default.name, default.artifact_location) == ("Default", str(db.parent / "mlruns" / "0"))
    new_id = tracking.experiment_id("xmr/synth", f"sqlite:///{db}")
    assert new_id == tracking.experiment_id("xmr/synth", f"sqlite:///{db}")  # created once
    assert client.get_experiment(new_id).artifact_location == str(db.parent / "mlruns" / new_id)


@pytest.mark.parametrize("scratch", ["absent", "full"])
def test_a_new_sqlite_store_is_built_beside_itself_without_memory_scratch_space(tmp_path, monkeypatch, scratch):
    # no /dev/shm (macOS, some containers), or one that is full: the store is built in its own folder, still moved
    # into place whole, and the scratch folder there is gone afterwards
    import mlflow

    from xmr.run import tracking

    shm = tmp_path / "shm"
    if scratch == "full":
        shm.mkdir()
    monkeypatch.setattr(tracking, "MEMORY_SCRATCH", shm)
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    roots = []  # where each build's scratch folder was asked for
    real_tmpdir = tracking.tempfile.TemporaryDirectory

    def tmpdir(*a, **k):
        roots.append(Path(k["dir"]))
        if Path(k["dir"]) == shm:
            raise OSError(28, "No space left on device", str(shm))
        return real_tmpdir(*a, **k)

    monkeypatch.setattr(tracking.tempfile, "TemporaryDirectory", tmpdir)
    monkeypatch.chdir(tmp_path)
    with tracking.store_lock(f"sqlite:///{db}"):
        assert db.is_file()
    assert roots == ([shm] if scratch == "full" else []) + [db.parent]
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]
    assert mlflow.MlflowClient(f"sqlite:///{db}").get_experiment("0").name == "Default"
