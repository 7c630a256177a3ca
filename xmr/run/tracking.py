"""MLflow tracking: one experiment per dataset (``xmr/{dataset}``), one run per trained recipe (named after it).

The store is ``$MLFLOW_TRACKING_URI`` when set (an ``xmr mlflow-server`` on a cluster), else ``sqlite:///mlflow.db``
in the working directory (MLflow >= 3.13 refuses the old ``./mlruns`` file store); a SQLite store's artifacts go to
``mlruns/`` beside its database file (:func:`artifact_root`). docs/tracking.md.

Every training run carries its recipe, method, dataset, backbone, git commit and feature checksum as tags, the
resolved config as params and ``config.yaml`` artifact, per-epoch validation metrics, and (logged by
:mod:`xmr.run.results`) the test metrics ``test_{plain|reranker}/{protocol}/{i2t_r1,...,rsum}``, so
:func:`results_table` can rebuild the results table from MLflow alone. Where the job runs is tagged too
(``slurm_job_id``, ``dvc_exp_name``, ``host``). ``$XMR_PARENT_RUN_ID`` nests runs under a sweep's parent run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from xmr.core.errors import XmrError

DEFAULT_URI = "sqlite:///mlflow.db"
PARENT_ENV = "XMR_PARENT_RUN_ID"
#: the experiment of `xmr report`'s runs (the report's files) for dataset D, apart from D's training runs
REPORT_EXPERIMENT = "xmr/{dataset}/reports"
# environment -> tag: where a run ran (SLURM job, DVC experiment), so an MLflow run leads back to its job log
ENV_TAGS = {"SLURM_JOB_ID": "slurm_job_id", "DVC_EXP_NAME": "dvc_exp_name"}


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def metrics_to_flat(metrics: dict, prefix: str) -> dict[str, float]:
    """``{"i2t": {"r1": ..}, "rsum": ..}`` -> ``{prefix/i2t_r1: .., prefix/rsum: ..}`` (numbers only; with extended
    positives also ``prefix/extended_i2t_map_at_r`` .., ``prefix/cxc_i2t_r1`` ..)."""
    flat = {}
    # only retrieval metrics: counts and re-ranker parameters are parameters, not metrics
    keep = {k: v for k, v in metrics.items() if k in ("i2t", "t2i", "rsum", "extended", "cxc")}
    for k, v in flatten(keep).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            flat[f"{prefix}/{k.replace('.', '_')}"] = float(v)
    return flat


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative to the working directory), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).resolve()


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Serialise first use of a local SQLite store between processes on this machine.

    Several jobs opening a new ``mlflow.db`` at once race MLflow's schema migrations ("table metrics already
    exists", "duplicate column name"); once the schema and the experiment exist, concurrent runs log fine.
    The lock lives in the temp dir (keyed by the database path), not beside the database. Servers need none.
    """
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    import fcntl

    key = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"xmr-mlflow-{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if not db.exists():
                create_sqlite_store(db)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: memory-backed scratch space for building a new SQLite store (absent or full: the store's own folder)
MEMORY_SCRATCH = Path("/dev/shm")


def create_sqlite_store(db: Path) -> None:
    """Build a new, migrated SQLite store in memory-backed scratch space (``/dev/shm`` where there is one) and move
    it into place whole. MLflow's schema migrations commit about a hundred times, each a sync to disk: ~7 s for a
    store built on a disk, ~2 s in memory; and a store interrupted while migrating is never left at ``db``."""
    from xmr.core.io import atomic_path

    shm = [str(MEMORY_SCRATCH)] if MEMORY_SCRATCH.is_dir() and os.access(MEMORY_SCRATCH, os.W_OK) else []
    for scratch_root in shm + [str(db.parent)]:
        try:
            with tempfile.TemporaryDirectory(prefix=".xmr-mlflow-", dir=scratch_root) as scratch:
                built = Path(scratch) / db.name
                # creates and migrates the schema, and the Default experiment with its artifacts beside `db`
                _sqlite_store(f"sqlite:///{built}", artifact_root(db)).engine.dispose()
                with atomic_path(db) as tmp:
                    shutil.copyfile(built, tmp)
            return
        except OSError:
            if scratch_root == str(db.parent):
                raise  # the store's own folder: its error is the user's to see


def artifact_root(db: Path) -> str:
    """Where a local SQLite store's experiments keep their runs' artifacts: ``mlruns/`` beside the database, so a
    store and its artifacts stay together whatever the working directory of the job that created them (MLflow's
    own default is ``./mlruns`` of that directory). ``sqlite:///mlflow.db`` in the repository: ``./mlruns``."""
    return str(db.parent / "mlruns")


def _sqlite_store(uri: str, root: str):
    """MLflow's SQLite store with ``root`` as its artifact root (a new database is created and migrated)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    return SqlAlchemyStore(uri, root)


def experiment_id(name: str, uri: str) -> str:
    """The id of experiment ``name`` in the store at ``uri``, created (with the store) when missing. A local SQLite
    store creates it with its artifacts under :func:`artifact_root`; a server, where its artifact root says."""
    import mlflow
    from mlflow.exceptions import MlflowException

    with store_lock(uri):
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is None:
            db = sqlite_path(uri)
            if db is not None:  # the lock serialises this with every other job on the machine
                store = _sqlite_store(uri, artifact_root(db))
                try:
                    return store.create_experiment(name)
                finally:
                    store.engine.dispose()
            try:
                return client.create_experiment(name)
            except MlflowException:  # a job on another machine created it at the same moment (no lock there)
                exp = client.get_experiment_by_name(name)
                if exp is None:
                    raise
    if exp.lifecycle_stage == "deleted":
        raise XmrError(f"MLflow experiment {name!r} in {uri} is deleted: restore it (`MLFLOW_TRACKING_URI={uri} "
                       f"mlflow experiments restore --experiment-id {exp.experiment_id}`), or set "
                       f"tracking.experiment to another name")
    return exp.experiment_id


def prepare_store(experiment: str | None = None, uri: str | None = None) -> str | None:
    """Create the store (and ``experiment``) once, before jobs fan out; returns the experiment id."""
    import mlflow

    uri = uri or tracking_uri()
    mlflow.set_tracking_uri(uri)
    if experiment is not None:
        return experiment_id(experiment, uri)
    with store_lock(uri):
        mlflow.MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates a new store
    return None


def environment_tags(env: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    tags = {tag: env[var] for var, tag in ENV_TAGS.items() if env.get(var)}
    tags["host"] = socket.gethostname()
    return tags


def shared_sqlite_note(uri: str, env: dict[str, str] | None = None) -> str | None:
    """The start-up note of a SLURM job logging to a SQLite file: many jobs on one SQLite file (worse, on a
    network file system) lock and can corrupt it; a tracking server is the supported cluster mode."""
    env = os.environ if env is None else env
    db = sqlite_path(uri)
    if db is None or not env.get("SLURM_JOB_ID"):
        return None
    return (f"note: SLURM job {env['SLURM_JOB_ID']} logs to the SQLite file {db}; many jobs sharing one SQLite file "
            f"(especially on a network file system) hit 'database is locked' and can corrupt it: start "
            f"`xmr mlflow-server` and export MLFLOW_TRACKING_URI=http://HOST:PORT (docs/tracking.md)")


def cluster_sqlite_warning(non_local_exec: bool, uri: str | None = None) -> str | None:
    """What the workflow prints when it starts submitting jobs to a cluster (`snakemake --profile slurm`) while
    runs would log to a SQLite file: every job would share that one file. None when jobs run locally or log to a
    server."""
    uri = uri or tracking_uri()
    db = sqlite_path(uri)
    if not non_local_exec or db is None:
        return None
    return (f"xmr: warning: cluster jobs will all log to the one SQLite file {db} ({uri}); many jobs on one SQLite "
            f"file (worse, on a network file system) lock it and can corrupt it. Start `xmr mlflow-server` on a "
            f"login node and export MLFLOW_TRACKING_URI=http://HOST:PORT before submitting (docs/tracking.md).")


def warn_cluster_sqlite(non_local_exec: bool, stream=None) -> bool:
    """Print :func:`cluster_sqlite_warning` (the workflow's ``onstart``); True when it warned."""
    import sys

    msg = cluster_sqlite_warning(non_local_exec)
    if msg:
        print(msg, file=stream or sys.stderr, flush=True)
    return msg is not None


def retry_locked(fn, *args, attempts: int = 8, first_wait: float = 0.2, **kwargs):
    """``fn(*args, **kwargs)``, retried with exponential back-off (plus jitter) while SQLite answers "database
    is locked" (many jobs writing one ``mlflow.db``); any other error, or the last attempt's, propagates."""
    import random
    import time

    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - sqlalchemy/MlflowException both carry the sqlite message
            if "database is locked" not in str(e) or i == attempts - 1:
                raise
            time.sleep(first_wait * 2 ** i * (1 + random.random()))


class Terminated(KeyboardInterrupt):
    """SIGTERM received (Snakemake cancelling a job, SLURM's time limit, ``kill``), raised in the main thread like
    Ctrl-C's KeyboardInterrupt, so that the run being tracked ends as ``KILLED`` instead of staying ``RUNNING``."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextmanager
def terminate_raises() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (main thread only: elsewhere Python allows no handler);
    the previous handler comes back on leaving. SIGKILL cannot be caught: the next attempt settles that run."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Tracker:
    """Thin wrapper so training code does not care whether tracking is on. Writes retry while a shared
    SQLite store is locked (:func:`retry_locked`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.run_id: str | None = None
        if enabled:
            import mlflow

            self.uri = tracking_uri()
            mlflow.set_tracking_uri(self.uri)
            self.mlflow = mlflow
            note = shared_sqlite_note(self.uri)
            if note:
                print(note, file=sys.stderr, flush=True)

    def status(self, run_id: str) -> str | None:
        """A run's status in this store (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``), None if not there."""
        try:
            return self.mlflow.MlflowClient(self.uri).get_run(run_id).info.status
        except Exception:  # unknown id, or a run of another store
            return None

    def _stored(self, run_id: str) -> bool:
        """``run_id`` is in a store that already exists (a server, or a SQLite file already there): reopening it
        needs neither its experiment nor the first-use lock, so the evaluations of one run (``xmr test``, one per
        re-ranker) do not queue on each other. Never creates a SQLite store outside :func:`store_lock`."""
        db = sqlite_path(self.uri)
        return (db is None or db.exists()) and self.status(run_id) is not None

    def settle(self, id_file: Path, run_id: str | None, resume: bool) -> str | None:
        """The truth about an earlier attempt of this training (its run id is in ``id_file``, written when the
        attempt started): a ``RUNNING`` run there was killed (SIGKILL, SLURM time limit, node failure).

        Resumed (``resume`` and ``run_id`` from the checkpoint, or no checkpoint yet and that run still
        ``RUNNING``): that run is continued, so one training is one run. Not resumed (``--no-resume``, a
        changed config): it is marked ``KILLED``. Returns the run id to reopen, or None for a new run."""
        prev = id_file.read_text().strip() if id_file.exists() else None
        if run_id and self.status(run_id) is None:
            print(f"note: MLflow run {run_id} (from the checkpoint) is not in {self.uri}; starting a new run",
                  flush=True)
            run_id = None
        if resume and run_id is None and prev and self.status(prev) == "RUNNING":
            run_id = prev  # killed before its first checkpoint: continue the same run
        if prev and prev != run_id and self.status(prev) == "RUNNING":
            self.mlflow.MlflowClient(self.uri).set_terminated(prev, status="KILLED")
            print(f"MLflow run {prev} of an earlier, killed attempt marked KILLED", flush=True)
        return run_id

    @contextmanager
    def run(self, experiment: str, run_name: str, run_id: str | None = None, tags: dict | None = None,
            parent_run_id: str | None = None, id_file: str | os.PathLike | None = None,
            resume: bool = True) -> Iterator["Tracker"]:
        """Start (or, with ``run_id``, reopen) a run; a new run nests under ``parent_run_id`` or
        ``$XMR_PARENT_RUN_ID`` when given (sweeps). ``id_file`` (beside a training's ``last.pt``) records the
        run id of each attempt, so the next attempt can continue it or mark it ``KILLED`` (:meth:`settle`)."""
        if not self.enabled:
            yield self
            return
        mlflow = self.mlflow
        exp_id = None
        reopen = bool(run_id) and id_file is None and self._stored(run_id)
        if not reopen:  # a plain reopen needs no experiment
            exp_id = experiment_id(experiment, self.uri)  # named, never the active one: a run cannot land in Default
        # a plain reopen (an evaluation logging to its training's run) that is interrupted gives the run back its status
        before = self.status(run_id) if reopen else None
        if id_file is not None:
            id_file = Path(id_file)
            run_id = self.settle(id_file, run_id, resume)
        kwargs: dict[str, Any] = {"run_id": run_id} if run_id else {"run_name": run_name,
                                                                     "experiment_id": exp_id}
        parent_run_id = parent_run_id or os.environ.get(PARENT_ENV) or None
        if parent_run_id and not run_id:
            kwargs.update(nested=True, parent_run_id=parent_run_id)
        with mlflow.start_run(**kwargs) as active, terminate_raises():
            self.run_id = active.info.run_id
            if id_file is not None:
                from xmr.core.io import atomic_path

                with atomic_path(id_file) as tmp:
                    tmp.write_text(self.run_id + "\n")
            if not run_id:
                mlflow.set_tags(environment_tags())
            if tags:
                mlflow.set_tags({k: str(v) for k, v in tags.items()})
            try:
                yield self
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (terminate_raises): stopped, not failed
                retry_locked(mlflow.end_run, before if before in ("FINISHED", "FAILED", "KILLED") else "KILLED")
                raise

    def log_params(self, params: dict) -> None:
        if self.enabled:
            flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
            items = list(flat.items())
            for i in range(0, len(items), 100):
                retry_locked(self.mlflow.log_params, dict(items[i : i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.enabled and metrics:
            retry_locked(self.mlflow.log_metrics, metrics, step=step)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if self.enabled and os.path.exists(path):
            self.mlflow.log_artifact(path, artifact_path)

    def log_dict(self, obj: dict, name: str) -> None:
        if self.enabled:
            retry_locked(self.mlflow.log_dict, obj, name)

    def set_tags(self, tags: dict) -> None:
        if self.enabled:
            retry_locked(self.mlflow.set_tags, {k: str(v) for k, v in tags.items()})


# --- the results table from MLflow alone ----------------------------------------------------------------------

TEST_METRIC = re.compile(r"^test_(?P<tag>[^/]+)/(?P<protocol>[^/]+)/(?P<name>[a-z0-9_]+)$")
# metric name in MLflow -> column of the results table (the `xmr summarize` columns, xmr/report/tables.py)
TABLE_METRICS = {**{f"{d}_r{k}": f"{d} R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}, "rsum": "RSUM",
                 **{f"extended_{d}_map_at_r": f"{d} mAP@R (ext.)" for d in ("i2t", "t2i")}}


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v not in (None, "") else None


def _std_or_none(v: float | None) -> str | None:
    return None if v is None else f"{v:.4f}"  # as xmr/report/tables.py writes it


def results_table(experiment: str, uri: str | None = None, all_runs: bool = False) -> list[dict[str, Any]]:
    """One row per (run, test evaluation, protocol) of ``experiment``, read from MLflow alone.

    A row holds the ``xmr summarize`` columns (``dataset, target, protocol, i2t R@1 ... RSUM``; ``target`` is
    the recipe, plus ``_{reranker}`` when re-ranked) and ``run_name, run_id, parent_run_id, git_commit,
    features_sha256``. Without ``all_runs``, only the newest top-level run of each run name counts (a retrained
    recipe replaces its older runs); the child runs of a sweep are all listed.
    """
    import mlflow
    from mlflow.entities import ViewType

    uri = uri or tracking_uri()
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
        raise XmrError(f"MLflow experiment {experiment!r} not found at {uri} "
                       f"(experiments there: {', '.join(known) or 'none'}); check MLFLOW_TRACKING_URI")
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                              order_by=["attributes.start_time DESC"], max_results=50000)
    rows, seen = [], set()
    for run in runs:
        tags, name = run.data.tags, run.info.run_name
        parent = tags.get("mlflow.parentRunId", "")
        if not all_runs and not parent and name in seen:
            continue
        evaluations: dict[tuple[str, str], dict[str, float]] = {}
        for metric, value in run.data.metrics.items():
            m = TEST_METRIC.match(metric)
            if m:
                evaluations.setdefault((m["tag"], m["protocol"]), {})[m["name"]] = value
        if not evaluations:
            continue  # a run still training, never evaluated, or a sweep's parent
        seen.add(name)
        recipe = tags.get("recipe", name)
        for (tag, protocol), values in sorted(evaluations.items()):
            rows.append({"dataset": tags.get("dataset", experiment.split("/")[-1]),
                         "target": recipe if tag == "plain" else f"{recipe}_{tag}", "protocol": protocol,
                         **{col: values.get(metric) for metric, col in TABLE_METRICS.items()},
                         "epochs": _int_or_none(tags.get("epochs_trained")), "ended by": tags.get("stopped_by"),
                         "test sim. std": _std_or_none(run.data.metrics.get("test_similarity_std")),
                         "run_name": name, "run_id": run.info.run_id, "parent_run_id": parent,
                         "git_commit": tags.get("git_commit", ""),
                         "features_sha256": tags.get("features_sha256", "")})
    rows.sort(key=lambda r: (r["dataset"], r["parent_run_id"], r["target"], r["protocol"], r["run_name"]))
    return rows
