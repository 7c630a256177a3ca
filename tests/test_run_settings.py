"""The typed settings of a run (xmr/settings/run_settings.py) against the run schema, as the methods' settings are
held to theirs (tests/test_method_conformance.py): every field names a schema key or is one of the few derived ones;
every key of the sections the settings own is some class's field, and only one's; a config with nothing set gives each
field the schema's default. Then the derived values, worked out by hand, and the rule that the parts below the
trainer take settings, not the run config."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

from xmr.config.loader import validate
from xmr.core.errors import XmrError
from xmr.run.config import run_schema
from xmr.settings.run_settings import (SETTINGS_CLASSES, ImageInput, RunSettings, Stopping, Tracking, _fill,
                                       run_settings, settings_fields)

XMR = Path(__file__).resolve().parents[1] / "xmr"
# the sections the settings own, whole; the method's door reads model, loss, eval scoring and the encoder's text
# keys, the optimizer its optim section
OWNED = ("features", "image_backbone", "train", "optim.schedule", "tracking")


def schema_node(dotted: str) -> dict:
    node = run_schema()
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def leaf_keys(prefix: str) -> set[str]:
    """The dotted keys under ``prefix`` whose values are not sections of their own."""
    out = set()
    for name, sub in schema_node(prefix)["properties"].items():
        key = f"{prefix}.{name}"
        if sub.get("type") == "object" and "properties" in sub:
            out |= leaf_keys(key)
        else:
            out.add(key)
    return out


def bare_config() -> dict:
    """A run config with nothing set beyond what the schema requires, validated (defaults filled)."""
    cfg = {"name": "bare", "method": "vsepp", "dataset": "synth", "features": {}, "model": {"embed_dim": 8},
           "loss": {}, "optim": {}, "train": {}, "eval": {}}
    validate(cfg, run_schema(), "bare")
    cfg["dataset_cfg"] = {"name": "synth"}
    return cfg


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_each_field_is_a_schema_key_or_a_derived_value(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert set(settings_fields(cls)) == set(cls.KEYS) | set(cls.DERIVED)
    assert not set(cls.KEYS) & set(cls.DERIVED)
    for field, key in cls.KEYS.items():
        schema_node(key)  # a KeyError names a key the schema does not have


def test_every_key_of_the_owned_sections_is_one_field():
    owners: dict[str, list[str]] = {}
    for cls in SETTINGS_CLASSES:
        for key in cls.KEYS.values():
            owners.setdefault(key, []).append(cls.__name__)
    owned = set().union(*(leaf_keys(p) for p in OWNED))
    assert sorted(owned - set(owners)) == []  # a schema key no settings class reads
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_a_bare_config_gives_every_field_the_schema_default(cls):
    settings = run_settings(bare_config())
    obj = next(getattr(settings, f.name) for f in dataclasses.fields(RunSettings)
               if isinstance(getattr(settings, f.name), cls))
    for field, key in cls.KEYS.items():
        node = schema_node(key)
        if "default" in node:
            assert getattr(obj, field) == node["default"], (cls.__name__, field)


def test_a_settings_class_naming_a_key_the_config_lacks_fails_in_one_line():
    @dataclasses.dataclass(frozen=True)
    class Drifted:
        KEYS = {"batch": "train.batch"}  # misspelt: train.batch_size
        DERIVED = ()
        batch: int

    with pytest.raises(XmrError, match=r"^Drifted: key 'batch' is not in the run config; make Drifted.KEYS the "
                                       r"run schema's keys$"):
        _fill(Drifted, bare_config())


def test_derived_values_by_hand():
    cfg = bare_config()
    s = run_settings(cfg)
    # the rule off: the cap is train.epochs (schema default 30); experiment and run name default by rule
    assert (s.stopping.cap, s.schedule.epochs) == (30, 30)
    assert (s.tracking.experiment_name, s.tracking.name) == ("xmr/synth", "bare")
    cfg = copy.deepcopy(cfg)
    cfg["train"]["early_stopping"].update(enabled=True, max_epochs=12)
    cfg["tracking"].update(experiment="mine", run_name="r1")
    cfg["features"].update(backbone="butd", dir="/f")
    cfg["text"].update(encoder="precomputed")
    cfg["features"]["text"] = "hglmm"
    s = run_settings(cfg)
    assert s.stopping.cap == 12 and isinstance(s.stopping, Stopping)
    assert s.tracking == Tracking(True, "mine", "r1", "mine", "r1")
    assert s.image.feature_path("test") == Path("/f/synth/butd/test.h5")
    assert s.text.precomputed_dir == Path("/f/synth/hglmm")


def test_the_unfreeze_loss_ramp_by_hand():
    """VSE∞'s warmup_alpha: in the first trained-backbone epoch (frozen_epochs = 1) step 5 of 10 scales by 0.5."""
    cfg = bare_config()
    cfg["features"]["source"] = "images"
    cfg["image_backbone"].update(frozen_epochs=1, unfreeze_loss_ramp=True)
    image = run_settings(cfg).image
    assert isinstance(image, ImageInput) and image.end_to_end
    assert [image.loss_scale(e, 5, 10) for e in (0, 1, 2)] == [1.0, 0.5, 1.0]
    assert [image.backbone_frozen(e) for e in (0, 1)] == [True, False]
    cfg["image_backbone"]["unfreeze_loss_ramp"] = False
    assert run_settings(cfg).image.loss_scale(1, 5, 10) == 1.0


def test_an_end_to_end_input_is_decided_and_checked_in_one_place(tmp_path):
    """The backbone entry with image_backbone.input_size applied; a bad crop_scale is a one-line error."""
    cfg = bare_config()
    cfg["features"].update(source="images", backbone="eff")
    cfg["backbone_cfg"] = {"name": "efficientnet_lite0", "input_size": 64, "key": "eff"}
    cfg["image_backbone"]["input_size"] = 96
    prep = run_settings(cfg).image.preparation
    assert (prep.size, prep.resize, prep.backbone_config["input_size"]) == (96, "squash", 96)
    cfg["image_backbone"]["crop_scale"] = [0.9, 0.5]
    with pytest.raises(XmrError, match=r"^bare: image_backbone.crop_scale: \[0.9, 0.5\]: expected \[low, high\]"):
        run_settings(cfg).image.preparation  # noqa: B018


# the modules below the trainer on its set-up path: each takes typed settings, none the run config
BELOW_THE_TRAINER = ("inference/loaders.py", "train/samplers.py", "train/stopping.py", "train/schedule.py",
                     "models/image_backbone.py", "run/inputs.py", "features/extract.py")


def cfg_parameters(path: Path) -> list[str]:
    """``function(cfg)`` for each function of ``path`` with a parameter named ``cfg`` or ``run_cfg``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in node.args.args + node.args.kwonlyargs]
            out += [f"{node.name}({n})" for n in names if n in ("cfg", "run_cfg")]
    return out


def test_the_check_sees_a_function_taking_the_run_config(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f(image, cfg):\n    return cfg\n\n\ndef g(image):\n    return image\n")
    assert cfg_parameters(src) == ["f(cfg)"]


@pytest.mark.parametrize("module", BELOW_THE_TRAINER)
def test_no_part_below_the_trainer_takes_the_run_config(module):
    assert cfg_parameters(XMR / module) == []


def test_a_precomputed_text_encoder_without_a_features_dir_is_one_line_naming_the_run():
    cfg = bare_config()
    cfg["text"]["encoder"] = "precomputed"  # neither features.text nor text.features_dir
    text = run_settings(cfg).text
    assert text.precomputed_dir is None
    with pytest.raises(XmrError, match=r"^bare: text.encoder is 'precomputed' but neither features.text \(e.g. "
                                       r"hglmm\) nor text.features_dir is set$"):
        text.required_features_dir("bare")
    cfg["text"]["features_dir"] = "/feats/hglmm"
    assert run_settings(cfg).text.required_features_dir("bare") == Path("/feats/hglmm")
