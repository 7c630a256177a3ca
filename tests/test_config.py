"""Config loading: extends/overrides, schema defaults, and one clear error naming the key for bad input."""


import pytest
import yaml

from xmr.config.loader import apply_overrides, deep_merge

from xmr.run.config import load_run_config
from xmr.core.errors import XmrError

from conftest import REPO, run_xmr


def test_deep_merge_and_overrides():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    merged = deep_merge(base, {"a": {"c": [3]}, "e": 2})
    assert merged == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base["a"]["c"] == [1, 2]  # not mutated
    assert apply_overrides(merged, ["a.b=0.5", "f.g=true"]) == {"a": {"b": 0.5, "c": [3]}, "d": 1, "e": 2,
                                                               "f": {"g": True}}


def test_repo_recipe_resolves_with_defaults():
    cfg = load_run_config(REPO / "config" / "recipes" / "synth" / "vsepp.yaml")
    assert cfg["method"] == "vsepp" and cfg["name"] == "vsepp"
    assert cfg["loss"]["margin"] == 0.2  # the vsepp schema default (VSE++ margin)
    assert cfg["loss"]["max_violation"] is True  # VSE++'s hardest negative, as the paper (synth v2 needs no switch)
    assert cfg["model"]["embed_dim"] == 256  # the recipe overrides the method default (1024)
    assert cfg["train"]["mask_same_image"] is True  # schema default filled in
    assert cfg["dataset_cfg"]["captions_per_image"] == 5
    assert cfg["backbone_cfg"]["name"] == "efficientnet_lite0"


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (REPO / "config" / "recipes" / "synth").glob("*.yaml")))
def test_synth_recipes_train_their_papers_hardest_negative(recipe):
    # no synth recipe switches a hardest-negative method to summed hinges for the whole run
    cfg = load_run_config(REPO / "config" / "recipes" / "synth" / f"{recipe}.yaml")
    loss = cfg["loss"]
    assert loss.get("max_violation", True) is True
    assert loss.get("warmup_epochs", 0) < cfg["train"]["epochs"]
    if cfg["method"] == "vse_inf":
        assert loss["warmup_epochs"] == 1  # VSE∞'s own one epoch of summed hinges


@pytest.mark.parametrize("override, message", [
    ("method=nosuchmethod", "method: unknown method 'nosuchmethod'"),
    ("loss.margin=-0.2", "loss.margin: -0.2 is less than the minimum of 0"),
    ("optim.lr=0", "optim.lr: 0 is less than or equal to the minimum of 0"),
    ("train.epochs=two", "train.epochs: 'two' is not of type 'integer'"),
    ("loss.marign=0.3", "unknown key 'loss.marign'; did you mean: margin?"),
    ("trian.epochs=3", "unknown key 'trian'; did you mean: train, tracking?"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(XmrError) as e:
        load_run_config(REPO / "config" / "recipes" / "synth" / "vsepp.yaml", [override])
    assert message in str(e.value)
    assert "vsepp.yaml" in str(e.value)


def test_missing_key_is_named(tmp_path):
    cfg_dir = tmp_path / "config"
    (cfg_dir / "recipes" / "synth").mkdir(parents=True)
    (cfg_dir / "datasets").mkdir()
    (cfg_dir / "datasets" / "synth.yaml").write_text((REPO / "config/datasets/synth.yaml").read_text())
    doc = yaml.safe_load((REPO / "config/methods/vsepp.yaml").read_text())
    doc.update(dataset="synth", features={"backbone": "efficientnet_lite0"})
    del doc["loss"]
    path = cfg_dir / "recipes" / "synth" / "broken.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError, match=r"broken.yaml: missing required key 'loss'"):
        load_run_config(path)


def test_cli_bad_config_fails_before_work_without_traceback(tmp_path):
    out = tmp_path / "run"
    r = run_xmr("train", "--config", REPO / "config/recipes/synth/vsepp.yaml", "--out-dir", out,
                "--set", "loss.margin=-1", cwd=REPO)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "xmr train: error: --set loss.margin=-1: loss.margin: -1 is less than the minimum of 0"]  # --set's, not the file's
    assert not out.exists()  # nothing written


def test_a_retired_key_is_one_line_that_says_why(tmp_path):
    # text.hidden_dim was accepted and never read (the BiGRU is model.embed_dim wide): setting it is now an error
    out = tmp_path / "run"
    recipe = REPO / "config/recipes/synth/vsepp.yaml"
    r = run_xmr("train", "--config", recipe, "--out-dir", out, "--set", "text.hidden_dim=2048", cwd=REPO)
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.strip().splitlines() == [
        f"xmr train: error: {recipe}: text.hidden_dim: not a setting any more (it never set anything: the BiGRU's "
        f"width is model.embed_dim (as in VSE++ and VSE∞)); remove it from the recipe (or the file it extends) and "
        f"from --set"]
    written = tmp_path / "recipe.yaml"  # in a recipe file, by way of the file it extends
    base = tmp_path / "base.yaml"
    base.write_text(f"extends: {recipe}\ntext: {{hidden_dim: 32}}\n")
    written.write_text(f"extends: {base}\n")
    with pytest.raises(XmrError, match=r"recipe.yaml: text.hidden_dim: not a setting any more"):
        load_run_config(written)


def test_missing_dataset_file_names_path_and_remedy(tmp_path):
    from xmr.config.loader import load_dataset_config
    from xmr.data import load_split

    ds = load_dataset_config("synth", REPO / "config")
    ds["annotations"] = str(tmp_path / "nowhere" / "dataset_synth.json")
    with pytest.raises(XmrError) as e:
        load_split(ds, "train")
    assert str(tmp_path / "nowhere" / "dataset_synth.json") in str(e.value)
    assert "xmr synth" in str(e.value)


def test_repeated_set_flags_accumulate():
    # `--set a=1 --set b=2` must keep both overrides (argparse's default for nargs="*" keeps only the last)
    from xmr.cli import build_parser

    for cmd in (["train", "--config", "c.yaml", "--out-dir", "o"], ["synth", "--out", "d"]):
        args = build_parser().parse_args([*cmd, "--set", "train.epochs=1", "--set", "train.threads=1", "x=2"])
        assert args.set == ["train.epochs=1", "train.threads=1", "x=2"], cmd


def test_one_key_value_parser():
    from xmr.config.loader import parse_assignments

    assert parse_assignments(["a.b=0.5", "c=[1, 2]", "d=x.npy", "e = true"]) == {"a.b": 0.5, "c": [1, 2],
                                                                              "d": "x.npy", "e": True}
    assert parse_assignments(["gamma1=25"], "--rerank-param", raw=True) == {"gamma1": "25"}
    with pytest.raises(XmrError, match=r"^--rerank-param 'gamma1': expected KEY=VALUE$"):
        parse_assignments(["gamma1"], "--rerank-param")
    with pytest.raises(XmrError, match=r"^--set '=3': expected KEY=VALUE$"):
        parse_assignments(["=3"], "--set")


def test_one_rerank_parameter_resolver():
    """CLI/API values over the run config's eval.rerank over the dataset's row of config/rerank/<name>.yaml over the
    code defaults: FR on CUB (a row of its own) and on COCO (the code's defaults), and a reading of FR (fr_val)
    takes FR's rows."""
    from xmr.config.loader import rerank_params

    assert rerank_params("fr", "cub")["gamma1"] == 9.0 and rerank_params("fr", "coco")["gamma1"] == 25.0
    run = {"fr": {"gamma1": 30.0, "lambda2": 7.0}}
    got = rerank_params("fr", "cub", run, {"gamma1": 40.0})
    assert (got["gamma1"], got["lambda2"], got["gamma2"]) == (40.0, 7.0, 8.0)
    assert rerank_params("fr_val", "cub")["gamma1"] == 9.0
    # a reading takes its base's section of the run config (PCME's log-probabilities), then its own
    pcme = {"dsl": {"scores": "log_prob"}}
    assert rerank_params("dsl_val", "synth", pcme)["scores"] == "log_prob"
    assert rerank_params("dsl_val", "synth", {**pcme, "dsl_val": {"scores": "similarity"}})["scores"] == "similarity"
    assert rerank_params("fr_val", "cub", run)["gamma1"] == 30.0 and "scores" not in rerank_params("fr_val", "cub", pcme)


def test_load_yaml_parses_each_text_once_and_hands_out_copies(tmp_path, monkeypatch):
    # planning reads the same config files hundreds of times (the benchmark's dry run: 868 loads of one file);
    # a text is parsed once, a changed file is parsed again, and every caller gets a dict of its own
    from xmr.config import loader as config
    calls = []
    real = config.safe_load
    monkeypatch.setattr(config, "safe_load", lambda text: calls.append(text) or real(text))
    config._parsed.cache_clear()
    p = tmp_path / "a.yaml"
    p.write_text("train: {epochs: 3}\n")
    first = config.load_yaml(p)
    first["train"]["epochs"] = 99  # a caller filling defaults in place
    assert config.load_yaml(p) == {"train": {"epochs": 3}} and len(calls) == 1
    p.write_text("train: {epochs: 4}\n")  # rewritten at once, same size: read again all the same
    assert config.load_yaml(p) == {"train": {"epochs": 4}} and len(calls) == 2
    p.write_text("- not a mapping\n")
    with pytest.raises(XmrError, match="expected a mapping at the top level"):
        config.load_yaml(p)
    with pytest.raises(XmrError, match="config file not found"):
        config.load_yaml(tmp_path / "missing.yaml")


def test_load_validated_validates_each_text_once_and_hands_out_copies(tmp_path, monkeypatch):
    # planning the seeded benchmark loaded and validated its file once per planned job (868 jsonschema runs, ~4 s)
    from xmr.config import loader as config
    calls = []
    real = config.validate
    monkeypatch.setattr(config, "validate", lambda doc, schema, src: calls.append(src) or real(doc, schema, src))
    config._validated.cache_clear()
    p = tmp_path / "backbone.yaml"
    p.write_text("name: vgg19\n")
    first = config.load_validated(p, "backbone")
    assert first["input_size"] == 224 and first["batch_size"] == 32  # the schema's defaults filled
    first["input_size"] = 99  # a caller changing its copy
    assert config.load_validated(p, "backbone")["input_size"] == 224 and len(calls) == 1
    p.write_text("name: vgg19\ninput_size: 256\n")  # rewritten: validated again
    assert config.load_validated(p, "backbone")["input_size"] == 256 and len(calls) == 2
    p.write_text("name: vgg19\ninput_sise: 256\n")
    with pytest.raises(XmrError, match=r"backbone.yaml: unknown key 'input_sise'; did you mean: input_size\?"):
        config.load_validated(p, "backbone")


def test_the_loaders_fast_safe_load_reads_every_project_yaml_as_pyyaml_safe_load_does():
    # the one loader parses with libyaml's safe loader where PyYAML has it: each file of the project must come out
    # as the reference parser reads it, and a malformed text must raise the reference parser's error (its message
    # and line are what the one-line error shows)
    from xmr.config import loader as config
    files = sorted({*REPO.glob("config/**/*.yaml"), *REPO.glob("xmr/schemas/**/*.yaml"), REPO / "dvc.yaml"})
    assert len(files) > 50
    for f in files:
        text = f.read_text()
        assert config.safe_load(text) == yaml.safe_load(text), f
    with pytest.raises(yaml.YAMLError) as got:
        config.safe_load("[unclosed")
    assert got.value.problem == "expected ',' or ']', but got '<stream end>'" and got.value.problem_mark.line == 0
