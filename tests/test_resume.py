"""A training run killed after an epoch resumes from last.pt and ends exactly like an uninterrupted run (CPU)."""

import signal

import pytest
from conftest import history_rows, train_cli


# CODER carries state outside the weights: momentum key encoders, a queue (64 entries: full and wrapped after one
# epoch of 15 steps x 16 keys) and its pointer, the concept vocabulary and graph. Losing any of them on resume
# changes the epoch-2 memory loss.
CASES = {"vsepp": {}, "coder": {"model": {"queue_size": 64, "n_prototypes": 16}}}


@pytest.mark.parametrize("method", list(CASES))
def test_killed_run_resumes_to_the_same_result(tiny_synth, tmp_path, method):
    recipe = tiny_synth.recipe(method, name=f"{method}_resume", train={"epochs": 3, "batch_size": 16},
                               **CASES[method])
    ref, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    train_cli(recipe, ref)
    assert train_cli(recipe, killed, kill_after_first_epoch=True) == -signal.SIGKILL
    assert not (killed / "train.json").exists()  # it really died before finishing
    output = train_cli(recipe, killed)
    assert f"resuming {killed} after epoch 1" in output  # continued, not restarted
    assert history_rows(killed) == history_rows(ref)  # same losses and validation metrics, epoch by epoch


def test_resume_with_another_process_count_says_the_global_batch_changed(tiny_synth, tmp_path, capsys):
    """last.pt records the number of processes; resuming with another count goes on but says the global batch
    (train.batch_size per process x processes) is not what it was."""
    import torch

    from xmr.run.config import load_run_config
    from xmr.core.io import load_checkpoint
    from xmr.train.trainer import train

    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_world", train={"epochs": 2, "batch_size": 16}))
    out = tmp_path / "run"
    train(cfg, out, progress=False)
    ck = load_checkpoint(out / "last.pt", "cpu")
    assert ck["world_size"] == 1
    # as if 4 processes had written it after epoch 1
    ck.update(world_size=4, epoch=0, history=ck["history"][:1])
    torch.save(ck, out / "last.pt")
    capsys.readouterr()
    train(cfg, out, progress=False)
    printed = capsys.readouterr().out
    assert f"resuming {out} after epoch 1" in printed
    assert "was written by 4, so the global batch changes from 64 to 16" in printed


def test_changed_training_features_start_the_run_over(tiny_synth, tmp_path, capsys):
    """Snakemake reruns a training when its features change, but last.pt is not an output it deletes: the run must
    not resume onto the new features (it did, and kept the model trained on the old ones)."""
    import shutil

    import h5py

    from xmr.run.config import load_run_config
    from xmr.train.trainer import train

    feats = tmp_path / "features"
    shutil.copytree(tiny_synth.features_dir, feats)
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_inputs", train={"epochs": 2},
                                            features={"dir": str(feats)}))
    out = tmp_path / "run"
    train(cfg, out, progress=False)
    capsys.readouterr()
    train(cfg, out, progress=False)  # same inputs: the finished run is resumed, not retrained
    assert f"resuming {out} after epoch 2" in capsys.readouterr().out
    with h5py.File(feats / "synth" / "efficientnet_lite0" / "train.h5", "r+") as f:
        f["features"][0] = f["features"][0] * 2  # one image's features change
    train(cfg, out, progress=False)
    printed = capsys.readouterr().out
    assert f"{out / 'last.pt'} was trained with other input files (training features, text features, backbone weights or annotations): starting over" \
        in printed
    assert "resuming" not in printed
