"""How big a target is (trainings it implies) and the Snakemake targets of the DVC stages (`make sync`)."""

from pathlib import Path

import pytest

from xmr.core.errors import XmrError
from xmr.commands.dvc_targets import dvc_snakemake_targets
from xmr.planning.workflow_inputs import planned_runs, training_count_message


class FakeExperiment:
    """The three things planned_runs reads of an xmr.studies.experiments.Experiment."""

    def __init__(self, name, recipe, variants, datasets=("synth",)):
        self.name, self.recipe, self.variants, self.datasets = name, recipe, variants, datasets

    def variants_for(self, dataset):
        return list(self.variants)

    def run_dir(self, dataset, variant, runs_root="runs"):
        if self.recipe:
            return Path(runs_root) / dataset / "exp" / self.name / variant
        return Path(runs_root) / dataset / variant


def test_planned_runs_counts_each_training_once(tmp_path):
    root = tmp_path / "runs"
    exps = [FakeExperiment("sweep", "dvse", ["k1", "k2"]),          # 2 new runs under exp/sweep
            FakeExperiment("fr_all", None, ["vsepp", "pcme"]),      # recipes: vsepp already counted, pcme new
            FakeExperiment("coco_only", "dvse", ["a"], ("coco",))]  # other dataset: none
    runs = planned_runs("synth", ["vsepp", "dvse"], exps, str(root))
    assert runs == sorted([root / "synth" / r for r in ("vsepp", "dvse", "pcme")]
                          + [root / "synth" / "exp" / "sweep" / v for v in ("k1", "k2")])
    (root / "synth" / "vsepp").mkdir(parents=True)
    (root / "synth" / "vsepp" / "train.json").write_text("{}")
    msg = training_count_message("reports/synth/report.html", runs)
    assert msg.startswith("reports/synth/report.html implies 5 trainings (1 already trained, 4 to run")


def test_dvc_snakemake_targets_reads_the_lock(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("dvc.lock").write_text(
        "schema: '2.0'\nstages:\n"
        "  data@synth:\n    cmd: snakemake --cores 2 features/synth/a.h5 features/synth/b.h5\n"
        "  train@synth-vsepp:\n    cmd: snakemake -c 2 --profile slurm results/synth/vsepp.json\n"
        "  other:\n    cmd: python make.py out.txt\n")
    assert dvc_snakemake_targets(existing_only=False) == ["features/synth/a.h5", "features/synth/b.h5",
                                                          "results/synth/vsepp.json"]
    Path("results/synth").mkdir(parents=True)
    Path("results/synth/vsepp.json").write_text("{}")
    assert dvc_snakemake_targets() == ["results/synth/vsepp.json"]  # a clone that pulled only that stage
    with pytest.raises(XmrError, match="missing.lock not found"):
        dvc_snakemake_targets("missing.lock")
