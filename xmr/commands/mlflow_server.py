"""xmr mlflow-server: the MLflow tracking server (UI + REST API) with the project's defaults (docs/tracking.md)."""

HELP = "start `mlflow server` on 127.0.0.1 with the project's store; jobs log to it via MLFLOW_TRACKING_URI"

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def add_arguments(p):
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only); 0.0.0.0 serves compute nodes, "
                        "and anyone else who can reach the port (MLflow has no authentication)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--backend-store-uri", default="sqlite:///mlflow.db",
                   help="runs database: sqlite:///path.db (one server process writes it) or "
                        "postgresql://user@db-host/mlflow (several servers / many jobs)")
    p.add_argument("--artifacts-destination", default="./mlartifacts",
                   help="where the server stores uploaded artifacts (jobs upload through the server)")
    p.add_argument("--workers", type=int, default=None, help="server worker processes (mlflow's default if unset)")
    p.add_argument("--allowed-hosts", default=None,
                   help="Host header values to accept besides localhost and private IPs, e.g. login1.cluster.edu")
    p.add_argument("--print-command", action="store_true",
                   help="print the command and the runs table's address of each experiment in the store, and exit")
    p.add_argument("extra", nargs="*", metavar="-- MLFLOW_ARGS", help="more `mlflow server` options, after --")


def server_command(args) -> list[str]:
    import sys

    cmd = [sys.executable, "-m", "mlflow", "server", "--host", args.host, "--port", str(args.port),
           "--backend-store-uri", args.backend_store_uri, "--artifacts-destination", args.artifacts_destination]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    if args.allowed_hosts:
        cmd += ["--allowed-hosts", args.allowed_hosts]
    return cmd + list(args.extra)


def tracking_uri_for_jobs(host: str, port: int) -> str:
    import socket

    name = host if host not in ("0.0.0.0", "::") else socket.getfqdn()
    return f"http://{name}:{port}"


def runs_table_urls(uri: str, base: str) -> list[str]:
    """The UI's runs table of each xmr experiment already in the store at ``uri``. MLflow 3 opens its GenAI pages
    (traces) unless the address asks for model training (``workflowType=machine_learning``); it has no server
    setting for the page it opens on (docs/tracking.md "The runs table")."""
    import mlflow

    from xmr.run.tracking import sqlite_path

    db = sqlite_path(uri)
    if db is not None and not db.exists():
        return []
    return [f"  {e.name}: {base}/#/experiments/{e.experiment_id}/runs?workflowType=machine_learning"
            for e in mlflow.MlflowClient(uri).search_experiments() if e.name.startswith("xmr/")]


def run(args):
    import os
    import sys

    from xmr.run.tracking import prepare_store

    cmd = server_command(args)
    ui = tracking_uri_for_jobs(args.host, args.port)
    if args.print_command:
        print(" ".join(cmd))
        print("\n".join(["runs tables:", *runs_table_urls(args.backend_store_uri, ui)]))
        return 0
    if args.host not in LOCAL_HOSTS:
        print(f"warning: serving on {args.host}:{args.port} without authentication; anyone who can reach it can "
              f"read and change runs (docs/tracking.md)", file=sys.stderr)
    os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    # the GenAI job runner (LLM judges) starts ~7 worker processes that outlive the server; xmr needs none
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    prepare_store(uri=args.backend_store_uri)  # migrate a new/old database once, before the workers start
    print(f"MLflow UI: http://{args.host}:{args.port}   jobs: "
          f"export MLFLOW_TRACKING_URI={tracking_uri_for_jobs(args.host, args.port)}", flush=True)
    print("\n".join(["runs tables:", *runs_table_urls(args.backend_store_uri, ui)]), flush=True)
    os.execv(sys.executable, cmd)
