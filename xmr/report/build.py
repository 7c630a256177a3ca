"""The results report of a dataset: ``report.html`` (self-contained, figures embedded as base64 PNG) and
``report.md`` (+ the PNGs beside it, for the README), built from ``results/``, ``runs/`` and the dataset's images.

Sections: results (xmr next to the paper's numbers for the same setting), the papers' numbers, training curves,
experiments (config/experiments), FR scale sensitivity, retrieval examples, sub-embeddings (DVSE Figs. 6 and 10).
What is not there yet (a method not trained, an experiment not run) becomes a note; the sections about given
recipes (FR grid, sub-embeddings) are left out where none of them is trained. Every recipe results file there is
is shown, whether config/report.yaml lists the recipe or not. Settings in ``config/report.yaml``; see
docs/report.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xmr.run.layout import RESULTS_ROOT, RUNS_ROOT, RunKey, fr_grid_dir
from xmr.core.errors import XmrError
from xmr.core.io import read_json
from xmr.report.tables import RECALLS, fmt, result_rows


@dataclass
class Block:
    kind: str  # text | table | figure | note
    text: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    row_classes: list[str] = field(default_factory=list)
    path: Path | None = None  # figure PNG (inside the output folder)
    run_dir: Path | None = None  # the run a figure belongs to (logged to its MLflow run)


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")

    def text(self, s: str) -> None:
        self.blocks.append(Block("text", s))

    def note(self, s: str) -> None:
        self.blocks.append(Block("note", s))

    def table(self, columns: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> None:
        self.blocks.append(Block("table", columns=columns, rows=rows, row_classes=row_classes or [""] * len(rows)))

    def figure(self, path: str | os.PathLike, caption: str, run_dir: str | os.PathLike | None = None) -> None:
        self.blocks.append(Block("figure", caption, path=Path(path), run_dir=Path(run_dir) if run_dir else None))


@dataclass
class Report:
    title: str
    datasets: list[str]
    sections: list[Section] = field(default_factory=list)
    generated: str = ""

    def figures(self) -> list[Block]:
        return [b for s in self.sections for b in s.blocks if b.kind == "figure"]


# -- results --------------------------------------------------------------------------------------------------------

def _result_paths(dataset: str, recipes: list[str], rerank: list[str],
                  results_root: Path) -> tuple[list[Path], list[str]]:
    found, missing = [], []
    for recipe in recipes:
        for rr in rerank:
            p = RunKey.recipe(dataset, recipe).result_path(rr, results_root)
            (found if p.exists() else missing).append(p if p.exists() else str(p))
    return found, missing


def results_present(dataset: str, results_root: Path, config_dir: Path) -> list[tuple[str, Path]]:
    """(recipe, file) of every recipe results file there is, ``results/{dataset}/{recipe}[_{reranker}].json``
    (the demo's ``dvse_demo*.json`` included): the report shows them, whether config/report.yaml lists the recipe
    or not. Other JSON files there (summaries, tables) name no recipe and are left out."""
    from xmr.run.layout import parse_target
    from xmr.report.tables import results_kind

    found = []
    for path in sorted((results_root / dataset).glob("*.json")):
        if path.name.endswith(".metrics.json"):
            continue
        try:
            recipe, _ = parse_target(dataset, path.stem, config_dir)
            if results_kind(read_json(path)) == "results":
                found.append((recipe, path))
        except XmrError:
            continue
    return found


def _metric_cells(row: dict, rp: bool, extra: list[str] = ()) -> list[str]:
    cells = [fmt(row.get(c)) for c in RECALLS]
    if rp:
        cells += [fmt(row.get("i2t R-P")), fmt(row.get("t2i R-P"))]
    return cells + [fmt(row.get("RSUM"))] + [fmt(row.get(c)) for c in extra]


def _extended_columns(rows: list[dict]) -> list[str]:
    """The extended-positive columns any of a protocol's rows has (ECCV Caption's, a dataset's own, CxC's)."""
    from xmr.report.tables import CXC, EXTENDED, EXTENDED_DETAIL

    wanted = EXTENDED + (EXTENDED_DETAIL if any(r.get("protocol") == "eccv" for r in rows) else []) + CXC
    return [c for c in wanted if any(r.get(c) is not None for r in rows)]


def results_section(dataset: str, settings: dict, recipes: list[str], results_root: Path,
                    runs_root: Path, present: list[tuple[str, Path]] = ()) -> tuple[Section, list[dict]]:
    """The main table: each trained recipe x re-ranker, with the paper's row for the same setting under it;
    ``present``: the other results files there are (:func:`results_present`), shown too."""
    from xmr.report.paper import match_entry, paper_entries, paper_row

    sec = Section(f"Results on {dataset}")
    paths, missing = _result_paths(dataset, recipes, settings["rerank"], results_root)
    paths += [p for _, p in present if p not in paths]  # after the configured ones, by name
    rows = result_rows(paths, runs_root, all_protocols=True)
    if not rows:
        sec.note(f"No results on {dataset} yet: build them with `snakemake -c2 "
                 f"{' '.join(str(results_root / dataset / (r + '.json')) for r in recipes[:3])} ...`.")
        return sec, rows
    entries = paper_entries(dataset)
    sec.text("Test split, every protocol of the dataset. Under each xmr row, in grey, the number the paper reports "
             "for the same setting (dataset, protocol, re-ranker and recipe), where it reports one. RSUM = the six "
             "recalls summed; the best xmr RSUM per protocol is in bold.")
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        prow = [r for r in rows if r["protocol"] == protocol]
        rp = any("i2t R-P" in r for r in prow)
        extra = _extended_columns(prow)
        cols = ["method", "recipe", "re-rank", *RECALLS] + (["i2t R-P", "t2i R-P"] if rp else []) + \
               ["RSUM", *extra, "train (min)", "source"]
        best = max((r["RSUM"] for r in prow if r["RSUM"] is not None), default=None)
        cells, classes = [], []
        for r in prow:
            line = [str(r["method"]), r["recipe"], "plain" if r["rerank"] == "none" else r["rerank"],
                    *_metric_cells(r, rp, extra), fmt(r["train (min)"]) if r["rerank"] == "none" else "", "xmr"]
            if best is not None and r["RSUM"] == best:
                at = cols.index("RSUM")
                line[at] = f"**{line[at]}**"
            cells.append(line)
            classes.append("")
            e = match_entry(entries, dataset, r["recipe"], protocol, r["rerank"])
            if e:
                cells.append(["", "", f"paper ({e['setting']})", *_metric_cells(paper_row(e), rp, extra), "",
                              e["source"]])
                classes.append("paper")
        if len(set(r["protocol"] for r in rows)) > 1:
            sec.text(f"**Protocol `{protocol}`**")
        sec.table(cols, cells, classes)
    trained = {r["recipe"] for r in rows}
    absent = [r for r in recipes if r not in trained]
    if absent:
        sec.note(f"Not trained/evaluated yet on {dataset}: {', '.join(absent)} (e.g. `snakemake -c2 "
                 f"{results_root / dataset / (absent[0] + '.json')}`).")
    partial = [m for m in missing if Path(m).stem.rpartition("_")[0] in trained or Path(m).stem in trained]
    if partial:
        sec.note("Not evaluated yet: " + ", ".join(f"`{m}`" for m in partial) + ".")
    return sec, rows


def paper_section(dataset: str) -> Section:
    """Every number the papers report for ``dataset``; for a dataset no paper uses (synth), each method's
    main-setting numbers on the real datasets, for reference."""
    from xmr.report.paper import paper_entries, paper_row

    entries = paper_entries(dataset)
    sec = Section(f"Numbers reported by the papers ({dataset})")
    if not entries:
        entries = [e for e in paper_entries() if e["recipe"] == e["method"] and e["rerank"] in ("none", "fr")]
        sec.title = "Numbers reported by the papers (real datasets)"
        sec.text(f"No seed paper reports results on `{dataset}`. For reference, each method's main setting on the "
                 f"real datasets, as transcribed in `xmr/report/paper_results.yaml` from the method cards:")
    else:
        sec.text("Transcribed in `xmr/report/paper_results.yaml` from the method cards (each entry names its table); "
                 "`recipe` is the xmr recipe of the same setting.")
    rp = any(e.get("i2t_rp") is not None for e in entries)
    cross = len({e["dataset"] for e in entries}) > 1
    cols = ["method"] + (["dataset"] if cross else []) + ["protocol", "setting", "re-rank", *RECALLS] + \
           (["i2t R-P", "t2i R-P"] if rp else []) + ["RSUM", "xmr recipe", "source"]
    rows = []
    for e in sorted(entries, key=lambda e: (e["dataset"], e["protocol"], e["method"], e["setting"], e["rerank"])):
        method = e["method"] + (" (quoted)" if e["role"] == "baseline" else "")
        rows.append([method] + ([e["dataset"]] if cross else []) + [
            e["protocol"], e["setting"], "plain" if e["rerank"] == "none" else e["rerank"],
            *_metric_cells(paper_row(e), rp), f"`{e['recipe']}`",
            e["source"] + (f" — {e['note']}" if e.get("note") else "")])
    sec.table(cols, rows)
    sec.text("(quoted) = a baseline number the paper quotes for another method; the others are the paper's own "
             "method.")
    return sec


# -- the other sections ----------------------------------------------------------------------------------------------

def curves_section(dataset: str, recipes: list[str], runs_root: Path, out: Path) -> Section:
    from xmr.core.io import read_history
    from xmr.report.figures import plot_training_curves

    sec = Section("Training curves")
    runs = {r: RunKey.recipe(dataset, r).run_dir(runs_root) for r in recipes}
    histories = {r: read_history(run) for r, run in runs.items() if (run / "history.csv").exists()}
    if not histories:
        sec.note(f"No training history under {runs_root / dataset}/*/history.csv yet.")
        return sec
    png = out / f"{dataset}_training_curves.png"
    plot_training_curves(histories, png, f"training curves on {dataset}")
    sec.figure(png, "Validation RSUM per epoch (left) and training loss relative to its first epoch (right), from "
                    "each run's history.csv.")
    return sec


def experiments_sections(dataset: str, names: list[str], results_root: Path, runs_root: Path, out: Path,
                         config_dir: Path) -> list[Section]:
    from xmr.report.experiment_table import (experiment_header, experiment_rows, experiment_table_cells,
                                             missing_note, plot_experiment)
    from xmr.report.paper import paper_experiment
    from xmr.studies.experiments import load_experiment

    sections = []
    for name in names:
        exp = load_experiment(name, config_dir)
        sec = Section(f"Experiment {name}" + (f" ({exp.doc['paper']})" if exp.doc.get("paper") else ""), level=3)
        sections.append(sec)
        if dataset not in exp.datasets:
            sec.note(f"`{name}` is not run on {dataset} (datasets: {', '.join(exp.datasets)}).")
            continue
        rows, missing = experiment_rows(exp, dataset, results_root, runs_root, config_dir)
        target = exp.results_dir(dataset, results_root) / "table.md"
        if not rows:
            sec.note(f"No results yet; build them with `snakemake -c2 {target}`.")
            continue
        for line in experiment_header(exp):
            sec.text(line)
        paper = paper_experiment(name)
        cols, cells = experiment_table_cells(exp, rows, paper)
        sec.table(cols, cells)
        if paper:
            sec.text(f"Paper RSUM: {paper['source']} (another dataset: compare trends, not values).")
        png = out / f"{dataset}_exp_{name}.png"
        plot_experiment(exp, rows, png)
        kind = "RSUM and R@1 against the swept value" if exp.figure_kind == "line" else "RSUM per variant"
        sec.figure(png, f"{name}: {kind}, one colour per re-ranker.")
        if missing:
            sec.note(missing_note(missing) + f" (`snakemake -c2 {target}`)")
    return sections


def _trained(dataset: str, recipe: str, runs_root: Path) -> bool:
    return (RunKey.recipe(dataset, recipe).run_dir(runs_root) / "best.pt").exists()


def fr_grid_section(dataset: str, settings: dict, results_root: Path, runs_root: Path, out: Path) -> Section | None:
    """The FR grid of each configured recipe that is trained (or has its grid); None when none is."""
    from xmr.report.fr_grid import plot_fr_grid

    sec = Section("FR scale sensitivity (DVSE Fig. 7)")
    fg = settings["fr_grid"]
    recipes = [r for r in fg["recipes"] if _trained(dataset, r, runs_root)
               or (fr_grid_dir(dataset, r, fg["split"], results_root) / "fr_grid.json").exists()]
    if not recipes:
        return None
    for recipe in recipes:
        path = fr_grid_dir(dataset, recipe, fg["split"], results_root) / "fr_grid.json"
        if not path.exists():
            sec.note(f"{recipe}: no FR grid yet; build it with `snakemake -c2 {path}`.")
            continue
        grid = read_json(path)
        png = out / f"{dataset}_fr_grid_{recipe}_{fg['split']}.png"
        plot_fr_grid(grid, png, f"{recipe} on {dataset} {grid.get('split', fg['split'])} ({grid['protocol']})",
                     grid.get("configured"))
        t, f = grid["best"]["tied"], grid["best"]["free"]
        sec.text(f"`{recipe}` on the {grid.get('split', fg['split'])} split ({grid['protocol']}): plain RSUM "
                 f"{grid['plain']['rsum']:.1f}; best tied scales γ = {t['gamma']:g}, λ = {t['lambda']:g} give RSUM "
                 f"{t['rsum']:.1f}; best free scales γ1 = {f['gamma1']:g}, γ2 = {f['gamma2']:g}, "
                 f"λ1 = {f['lambda1']:g}, λ2 = {f['lambda2']:g} give {f['rsum']:.1f}. Configured FR scales: "
                 + ", ".join(f"{k} = {v:g}" for k, v in (grid.get("configured") or {}).items()) + ".")
        sec.figure(png, "Image→text recall sum over (γ1, γ2), text→image over (λ1, λ2), and RSUM with tied "
                        "scales; red: best cell, white dashed: the configured scales.", RunKey.recipe(dataset, recipe).run_dir(runs_root))
    return sec


def examples_section(dataset: str, settings: dict, rows: list[dict], runs_root: Path, out: Path) -> Section:
    from xmr.report.figures import retrieval_examples

    sec = Section("Retrieval examples")
    ex = settings["examples"]
    recipe = ex["recipe"]
    if recipe is None:
        plain = [r for r in rows if r["rerank"] == "none" and r["RSUM"] is not None]
        head = {r["recipe"]: r for r in reversed(plain)}  # first protocol of each recipe wins
        best = max(head.values(), key=lambda r: r["RSUM"], default=None)
        recipe = best["recipe"] if best else None
    if recipe is None:
        sec.note("No plain (not re-ranked) results to show examples from.")
        return sec
    run = RunKey.recipe(dataset, recipe).run_dir(runs_root)
    sims = run / "test_sims.npy"
    if not sims.exists():
        sec.note(f"{recipe}: no test similarities ({sims}); build them with `snakemake -c2 {sims}`.")
        return sec
    try:
        paths = retrieval_examples(run, sims, out, ex["queries"], ex["top_k"], ex["seed"])
    except XmrError as e:
        sec.note(f"{recipe}: retrieval examples skipped: {e}")
        return sec
    sec.text(f"From `{recipe}`{' (best plain RSUM)' if ex['recipe'] is None else ''}, plain similarities (no "
             f"re-ranking), test queries drawn with seed {ex['seed']}.")
    for direction, caption in (("t2i", "A caption and its top images; the ground-truth image is framed green "
                                       "(shown at the end with its rank when it is not in the top)."),
                               ("i2t", "An image and its top captions; ✓ marks the image's own captions.")):
        if direction in paths:
            renamed = out / f"{dataset}_{Path(paths[direction]).name}"
            Path(paths[direction]).replace(renamed)
            sec.figure(renamed, caption, run)
    return sec


def subembeddings_section(dataset: str, settings: dict, runs_root: Path, out: Path) -> Section | None:
    """The sub-embeddings of each configured set-based recipe that is trained; None when none is."""
    from xmr.report.dvse_figures import plot_subembedding_correlation, subembedding_correlation
    from xmr.report.figures import attention_figure

    sec = Section("Sub-embeddings (DVSE Figs. 6 and 10)")
    se = settings["subembeddings"]
    recipes = [r for r in se["recipes"] if _trained(dataset, r, runs_root)]
    if not recipes:
        return None
    for recipe in recipes:
        run = RunKey.recipe(dataset, recipe).run_dir(runs_root)
        try:
            png = out / f"{dataset}_attention_{recipe}.png"
            info = attention_figure(run, png, se["images"], se["seed"])
            sec.figure(png, f"`{recipe}`: attention weights of each of the K = {info['num_embeds']} image "
                            f"sub-embeddings over the image (DVSE Fig. 10 shows region-similarity ranks instead); "
                            f"'masked' = switched off by the dynamic mask for this image.", run)
        except XmrError as e:
            sec.note(f"{recipe}: attention maps skipped: {e}")
        for kind, what in (("embeddings", "the sub-embeddings v^k used for retrieval"),
                           ("residuals", "the attention residuals v̂^k on which L_dc acts")):
            try:
                m = subembedding_correlation(run, kind=kind, device="cpu")
            except XmrError as e:
                sec.note(f"{recipe}: correlation of {kind} skipped: {e}")
                continue
            png = out / f"{dataset}_correlation_{recipe}_{kind}.png"
            plot_subembedding_correlation(m, png, f"{recipe}: cosine correlation of {kind}")
            sec.figure(png, f"`{recipe}`: mean cosine correlation between {what}, over the test images "
                            f"(DVSE Fig. 6).", run)
    return sec


# -- assembly and rendering ---------------------------------------------------------------------------------------

def build_report(datasets: list[str], out_dir: str | os.PathLike, config_dir: str | os.PathLike = "config",
                 results_root: str | os.PathLike = RESULTS_ROOT, runs_root: str | os.PathLike = RUNS_ROOT) -> Report:
    """Build every section (writing the figures into ``out_dir``); rendering is separate."""
    from xmr.report.settings import report_methods, report_settings

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_dir, results_root, runs_root = Path(config_dir), Path(results_root), Path(runs_root)
    report = Report(f"xmr results: {', '.join(datasets)}", list(datasets),
                    generated=_dt.datetime.now().isoformat(timespec="seconds"))
    for ds in datasets:
        settings = report_settings(ds, config_dir)
        recipes = report_methods(ds, settings, config_dir)
        present = results_present(ds, results_root, config_dir)
        sec, rows = results_section(ds, settings, recipes, results_root, runs_root, present)
        report.sections.append(sec)
        report.sections.append(paper_section(ds))
        if settings["curves"]:
            shown = list(dict.fromkeys([*recipes, *(r for r, _ in present)]))
            report.sections.append(curves_section(ds, shown, runs_root, out))
        if settings["experiments"]:
            report.sections.append(Section(f"Experiments on {ds}", [Block("text", "Sweeps and ablations "
                                           "(config/experiments); every variant is its own training run.")]))
            report.sections += experiments_sections(ds, settings["experiments"], results_root, runs_root, out,
                                                    config_dir)
        # a section about recipes none of which is trained here (DVSE's figures on a dataset of one's own) is left out
        for section in (fr_grid_section(ds, settings, results_root, runs_root, out),
                        examples_section(ds, settings, rows, runs_root, out) if rows else None,
                        subembeddings_section(ds, settings, runs_root, out)):
            if section is not None:
                report.sections.append(section)
    return report


_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<b>\1</b>")]


def _inline_html(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, out_dir: str | os.PathLike) -> str:
    """Markdown with figures as relative links to the PNGs in ``out_dir``."""
    out = Path(out_dir)
    lines = [f"# {report.title}", "", f"Generated {report.generated} by `xmr report` from results/ and runs/.", ""]
    for sec in report.sections:
        lines += ["#" * sec.level + " " + sec.title, ""]
        for b in sec.blocks:
            if b.kind == "text":
                lines += [b.text, ""]
            elif b.kind == "note":
                lines += [f"> Note: {b.text}", ""]
            elif b.kind == "table":
                lines.append("| " + " | ".join(_md_cell(c) for c in b.columns) + " |")
                lines.append("|" + "|".join("---" for _ in b.columns) + "|")
                for row, cls in zip(b.rows, b.row_classes):
                    cells = [_md_cell(c) for c in row]
                    if cls == "paper":
                        cells = [f"*{c}*" if c and not c.startswith("*") else c for c in cells]
                    lines.append("| " + " | ".join(cells) + " |")
                lines.append("")
            elif b.kind == "figure":
                rel = os.path.relpath(b.path, out)
                lines += [f"![{b.text}]({rel})", "", f"*{b.text}*", ""]
    return "\n".join(lines)


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;font-size:12px;margin:0.8em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
tr.paper td{color:#777;font-style:italic;background:#fafafa}
td.text{text-align:left;white-space:normal;min-width:16em;max-width:28em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:12px;color:#555}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:4px 10px;font-size:13px}
code{background:#f3f3f3;padding:0 3px;font-size:90%}
nav ul{columns:2;font-size:13px}
"""


def render_html(report: Report) -> str:
    """One self-contained HTML page: every figure embedded as a base64 PNG."""
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{html.escape(report.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(report.title)}</h1>",
             f"<p>Generated {html.escape(report.generated)} by <code>xmr report</code> from results/ and runs/.</p>",
             "<nav><ul>" + "".join(f"<li><a href='#{s.anchor}'>{html.escape(s.title)}</a></li>"
                                   for s in report.sections) + "</ul></nav>"]
    for sec in report.sections:
        parts.append(f"<h{sec.level} id='{sec.anchor}'>{html.escape(sec.title)}</h{sec.level}>")
        for b in sec.blocks:
            if b.kind == "text":
                parts.append(f"<p>{_inline_html(b.text)}</p>")
            elif b.kind == "note":
                parts.append(f"<p class='note'>{_inline_html(b.text)}</p>")
            elif b.kind == "table":
                head = "".join(f"<th>{html.escape(c)}</th>" for c in b.columns)
                body = []
                for row, cls in zip(b.rows, b.row_classes):
                    tds = []
                    for c, name in zip(row, b.columns):
                        wide = name in ("source", "setting", "changes", "re-rank") and len(c) > 12
                        tds.append(f"<td{' class=text' if wide else ''}>{_inline_html(c)}</td>")
                    body.append(f"<tr{f' class={cls}' if cls else ''}>{''.join(tds)}</tr>")
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
            elif b.kind == "figure":
                data = base64.b64encode(Path(b.path).read_bytes()).decode("ascii")
                parts.append(f"<figure><img alt='{html.escape(b.text, quote=True)}' src='data:image/png;base64,{data}'>"
                             f"<figcaption>{_inline_html(b.text)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def log_report_to_mlflow(report: Report, files: list[Path]) -> list[str]:
    """Log each figure to the MLflow run of the run it was made from (``mlflow_run_id`` in its train.json), and the
    report files plus every figure to a run named ``report`` in the dataset's report experiment
    (``xmr/{dataset}/reports``: the runs table of ``xmr/{dataset}`` lists training runs only). Returns what was done."""
    from xmr.run.config import load_saved_config
    from xmr.run.tracking import REPORT_EXPERIMENT, Tracker

    done = []
    by_run: dict[Path, list[Path]] = {}
    for b in report.figures():
        if b.run_dir is not None:
            by_run.setdefault(b.run_dir, []).append(b.path)
    tracker = Tracker(True)
    for run_dir, pngs in by_run.items():
        info_path = run_dir / "train.json"
        if not info_path.exists():
            continue
        info = read_json(info_path)
        cfg = load_saved_config(run_dir) if (run_dir / "config.yaml").exists() else None
        if not info.get("mlflow_run_id") or (cfg is not None and not cfg["tracking"]["enabled"]):
            continue
        try:  # through the client, not by reopening the run: its status (FINISHED, KILLED) stays what it was
            client = tracker.mlflow.MlflowClient(tracker.uri)
            for p in pngs:
                client.log_artifact(info["mlflow_run_id"], str(p), "report")
        except tracker.mlflow.exceptions.MlflowException as e:  # e.g. the run lives in another tracking store
            done.append(f"{run_dir}: MLflow run {info['mlflow_run_id']} not logged to ({str(e).splitlines()[0]})")
            continue
        done.append(f"{len(pngs)} figure(s) -> MLflow run {info['mlflow_run_id']} ({run_dir})")
    for ds in report.datasets:
        experiment = REPORT_EXPERIMENT.format(dataset=ds)  # apart from the training runs of xmr/{ds}
        client = tracker.mlflow.MlflowClient()
        exp = client.get_experiment_by_name(experiment)
        existing = None
        if exp is not None:
            runs = client.search_runs([exp.experiment_id], "attributes.run_name = 'report'", max_results=1,
                                      order_by=["attributes.start_time DESC"])
            existing = runs[0].info.run_id if runs else None
        with tracker.run(experiment, "report", run_id=existing, tags={"xmr_report": ds}):
            for p in files + [b.path for b in report.figures()]:
                tracker.log_artifact(str(p), "report")
            done.append(f"report files -> MLflow run {tracker.run_id} (experiment {experiment}, run 'report')")
    return done


def write_report(datasets: list[str], out_dir: str | os.PathLike, config_dir: str | os.PathLike = "config",
                 results_root: str | os.PathLike = RESULTS_ROOT, runs_root: str | os.PathLike = RUNS_ROOT,
                 track: bool | None = None) -> dict[str, Any]:
    """Build and write ``report.html`` and ``report.md`` (figures beside them); ``track`` (default: the settings'
    ``mlflow``) logs the figures to MLflow."""
    from xmr.core.io import atomic_path
    from xmr.report.settings import report_settings

    out = Path(out_dir)
    report = build_report(datasets, out, config_dir, results_root, runs_root)
    files = []
    for name, text in (("report.md", render_markdown(report, out)), ("report.html", render_html(report))):
        with atomic_path(out / name, ".tmp") as tmp:
            tmp.write_text(text)
        files.append(out / name)
    if track is None:
        track = all(report_settings(ds, config_dir)["mlflow"] for ds in datasets)
    logged = log_report_to_mlflow(report, files) if track else []
    notes = [b.text for s in report.sections for b in s.blocks if b.kind == "note"]
    return {"html": str(out / "report.html"), "md": str(out / "report.md"), "figures": [str(b.path) for b in
            report.figures()], "notes": notes, "mlflow": logged}


__all__ = ["Report", "Section", "Block", "build_report", "render_html", "render_markdown", "write_report",
           "log_report_to_mlflow"]
