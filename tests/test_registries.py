"""What Snakemake reads while it plans (method schemas, the run schema's name lists, the re-ranker registry) is
data or loads without torch, and stays equal to the registries that the code runs on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, xmr_env
from xmr.config.loader import load_schema, method_schema
from xmr.core.errors import XmrError
from xmr.methods import METHODS
from xmr.models.text import TEXT_ENCODERS
from xmr.run.config import load_run_config, run_schema
from xmr.similarity.measures import SIMILARITIES, SetMeasure


def _enums(schema) -> list[list]:
    """Every ``enum`` list in a JSON schema."""
    if isinstance(schema, dict):
        return ([schema["enum"]] if "enum" in schema else []) + [e for v in schema.values() for e in _enums(v)]
    if isinstance(schema, list):
        return [e for v in schema for e in _enums(v)]
    return []


def test_every_built_in_method_has_its_schema_file_and_no_file_is_orphaned():
    files = sorted(p.name.removesuffix(".schema.yaml") for p in (REPO / "xmr/schemas/methods").glob("*.schema.yaml"))
    assert files == METHODS.names()  # no plugin is loaded in the suite's own process
    for name in files:
        assert METHODS.get(name).schema is method_schema(name), name
    assert method_schema("not_a_method") is None


# The code's name tables each schema enum restates: adding a name to one and not the other fails here.
CODE_TABLES = [
    ("dvse", "xmr.models.set_heads", "ACTIVATIONS"), ("dvse", "xmr.models.set_heads", "NORM_POSITIONS"),
    ("dvse", "xmr.methods.dvse", "IMAGE_POOLS"), ("dvse", "xmr.methods.dvse", "TEXT_POOLS"),
    ("dvse", "xmr.methods.dvse", "IMAGE_PROJECTIONS"), ("dvse", "xmr.losses.orthogonal", "DC_MODES"),
    ("pvse", "xmr.models.set_heads", "ACTIVATIONS"), ("dive", "xmr.models.set_heads", "TEXT_GLOBALS"),
    ("dive", "xmr.models.slot_attention", "POSITION_LENGTHS"),
    ("dive", "xmr.models.image", "MLP_INPUTS"), ("dive", "xmr.methods.dive", "SPM_LR_SCOPES"),
    ("pcme", "xmr.methods.pcme", "SCORE_MEASURES"), ("pcme", "xmr.models.set_heads", "POOLS"),
    ("pcme", "xmr.methods.pcme", "LOGIT_SCALES"), ("rrf", "xmr.methods.rrf", "FUSIONS"),
    ("rrf", "xmr.losses.bi_rank", "NEGATIVE_SELECTIONS"), ("vse_inf", "xmr.models.pooling", "L2_NORMS"),
    ("vsepp", "xmr.methods.vsepp", "POOLS"),
    *[(m, "xmr.models.augment", "SIZE_AUGMENT_MODES") for m in ("coder", "dive", "dvse", "vse_2ad", "vse_inf")],
    *[(m, "xmr.models.augment", "TEXT_AUGMENT_STYLES") for m in ("dive", "pcme")],
]


@pytest.mark.parametrize("method,module,table", CODE_TABLES, ids=[f"{m}-{t}" for m, _, t in CODE_TABLES])
def test_a_method_schema_enum_lists_exactly_the_names_of_the_code_table(method, module, table):
    import importlib

    names = list(getattr(importlib.import_module(module), table))
    assert names in _enums(method_schema(method)), (method, table, names)


def test_run_schema_name_lists_are_the_registries(monkeypatch):
    """text.encoder and eval.similarity: the schema file lists the built-in names (validating a run config
    imports no torch); with $XMR_PLUGINS set, the registries' own names, a plugin's included."""
    props = load_schema("run")["properties"]
    assert sorted(props["text"]["properties"]["encoder"]["enum"]) == TEXT_ENCODERS.names()
    assert props["eval"]["properties"]["similarity"]["enum"] == [*SIMILARITIES.names(), "model"]
    with pytest.raises(XmrError, match=r"eval.similarity: 'cosin' is not one of \['chamfer', 'cosine'"):
        load_run_config(REPO / "config/recipes/synth/vsepp.yaml", ["eval.similarity=cosin"])

    name = "toy_measure"  # registered as a plugin would register it
    monkeypatch.setitem(SIMILARITIES._entries, name, SetMeasure(name, SIMILARITIES.get("cosine").reduce, True, 0))
    monkeypatch.delenv("XMR_PLUGINS", raising=False)
    with pytest.raises(XmrError, match="eval.similarity: 'toy_measure' is not one of"):
        load_run_config(REPO / "config/recipes/synth/vsepp.yaml", [f"eval.similarity={name}"])
    monkeypatch.setenv("XMR_PLUGINS", "json")  # any importable module: plugins are on
    assert name in run_schema()["properties"]["eval"]["properties"]["similarity"]["enum"]
    cfg = load_run_config(REPO / "config/recipes/synth/vsepp.yaml", [f"eval.similarity={name}"])
    assert cfg["eval"]["similarity"] == name


def test_checkpoint_formats_in_the_run_schema_are_the_registry():
    from xmr.checkpoints import CHECKPOINT_FORMATS

    formats = load_schema("run")["properties"]["checkpoint"]["properties"]["format"]["enum"]
    assert formats == CHECKPOINT_FORMATS.names()
    with pytest.raises(XmrError, match=r"checkpoint.format: 'vse_infinity' is not one of "
                                       r"\['pcme', 'pvse', 'transformers', 'vse_in"):
        load_run_config(REPO / "config/recipes/coco/vse_inf_official_bigru.yaml", ["checkpoint.format=vse_infinity"])


PLANNING = """
import sys
from xmr.planning.workflow_inputs import RunKey, rerank_inputs, run_config
from xmr.run.layout import parse_target
from xmr.studies.benchmark import load_benchmark
assert parse_target("synth", "dvse_fr_val", "config") == ("dvse", "fr_val")
cfg = run_config(RunKey.recipe("synth", "dvse"))
assert cfg["model"]["num_embeds"] == 6 and cfg["loss"]["eta"] == 0.6  # the method schema's defaults filled
assert rerank_inputs("runs/synth/dvse", "qbnorm") == {"bank_i2t": "runs/synth/dvse/qbnorm_bank_i2t.npy",
                                                 "bank_t2i": "runs/synth/dvse/qbnorm_bank_t2i.npy"}
assert load_benchmark("config/benchmark/benchmark.yaml").rerank
assert "torch" not in sys.modules, "planning imported torch"
import numpy as np
from xmr.rerank import rerank
i2t, t2i = rerank(np.array([[0.9, 0.1], [0.8, 0.2]], dtype=np.float32), "fr")
assert "torch" in sys.modules and i2t.shape == (2, 2)  # the stand-in imported torch on first use
print("ok")
"""


def test_what_planning_reads_loads_without_torch_and_torch_comes_on_first_use():
    r = subprocess.run([sys.executable, "-c", PLANNING], cwd=REPO, env=xmr_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("targets,planned", [
    (["results/synth/dvse_demo.json", "results/synth/dvse_demo_fr.json"], "rule train:"),  # the demo
    # a published checkpoint (docs/checkpoints.md), on a clone without COCO: the preflight names the file
    (["results/coco/vse_inf_official_bigru_fr.json"], "checkpoint (vse_infty)"),
], ids=["demo", "published_checkpoint"])
def test_planning_with_snakemake_imports_no_torch(targets, planned):
    """`snakemake -n` as the user types it (each cluster job starts Snakemake again): torch's import was 2-3 s of
    every start on the 2-core development VM."""
    # -F: plan every job even where this checkout has run the demo already
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "-F", "--nolock", "-c2", *targets]
    r = subprocess.run(cmd, cwd=REPO, env={**xmr_env(), "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True,
                       text=True, timeout=300)
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")]
    shown = r.stdout + "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("import time:"))
    assert r.returncode == 0, shown[-3000:]
    assert "xmr.run.config" in imported and "xmr.rerank" in imported  # it did validate and parse the targets
    assert planned in shown, shown[-3000:]
    assert "torch" not in imported
