"""`xmr mlflow-server` on 127.0.0.1, a small training logging to it over HTTP, and the MLflow UI in headless
Chromium (Debian's `chromium`, driven by Playwright with the system browser; no browser download) showing the
run and its test RSUM, the runs table opened as `xmr mlflow-server` prints its address (the "Model training" pages, not
MLflow 3's GenAI pages). docs/img/mlflow_ui.png is taken from a real `make demo` (docs/tracking.md), not from here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from .helpers import ensure_apt_packages, free_port

pytestmark = pytest.mark.integration

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited with {proc.returncode}: {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.read().strip() == b"OK":
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"mlflow server at {url} not healthy after {timeout} s")


@contextmanager
def mlflow_server(workdir: Path) -> Iterator[tuple[str, Path]]:
    """`xmr mlflow-server` (one worker) on a free port of 127.0.0.1; stopped with its process group."""
    port = free_port()
    env = dict(os.environ, MLFLOW_ENABLE_TELEMETRY="false")
    proc = subprocess.Popen([sys.executable, "-m", "xmr", "mlflow-server", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{workdir / 'server.db'}",
                             "--artifacts-destination", str(workdir / "artifacts")],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, workdir / "artifacts"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_mlflow_ui_shows_the_run_and_its_rsum(tiny_synth, tmp_path, monkeypatch):
    chromium = ensure_apt_packages({"chromium": "chromium"})["chromium"]
    from playwright import sync_api as playwright  # requirements.txt; uses the system chromium, downloads none
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as (url, artifacts):
        import mlflow

        from xmr.run.config import load_run_config
        from xmr.run.results import evaluate_run
        from xmr.train.trainer import train
        from xmr.inference.model import score_split

        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_ui", tracking={"enabled": True}))
        run_dir = tmp_path / "run"
        summary = train(cfg, run_dir, progress=False)
        sims, _ = score_split(run_dir, progress=False)
        np.save(run_dir / "test_sims.npy", sims)
        result = evaluate_run(run_dir, run_dir / "test_sims.npy")

        # REST: the run, its RSUM, and artifacts uploaded through the server into --artifacts-destination
        client = mlflow.MlflowClient(url)
        run = client.get_run(summary["mlflow_run_id"])
        assert run.data.metrics["test_plain/plain/rsum"] == pytest.approx(result["rsum"], abs=1e-9)
        assert list(artifacts.rglob("config.yaml")) and list(artifacts.rglob("history.csv"))

        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            # the runs table: the run is listed under its recipe's name, on the model-training pages
            page.goto(f"{url}/#/experiments/{run.info.experiment_id}/runs?workflowType=machine_learning",
                      wait_until="domcontentloaded")
            page.wait_for_selector("text=vsepp_ui", timeout=120_000)
            assert page.query_selector("text=Run Name") is not None  # the runs table's header, not the GenAI overview
            # the run page: its metrics table holds the test RSUM (the UI prints the full float)
            page.goto(f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}",
                      wait_until="domcontentloaded")
            cell = page.wait_for_selector("text=test_plain/plain/rsum", timeout=120_000)
            lines = page.inner_text("body").splitlines()
            shown = lines[lines.index("test_plain/plain/rsum") + 1]
            assert float(shown) == pytest.approx(result["rsum"], abs=1e-6)
            close = page.query_selector("[aria-label='Close']")  # the MLflow Assistant side panel
            if close:
                close.click()
            cell.scroll_into_view_if_needed()
            shot = tmp_path / "mlflow_ui.png"
            page.screenshot(path=str(shot))
            browser.close()
        assert shot.stat().st_size > 10_000
