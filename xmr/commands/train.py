"""xmr train: train one recipe (method x dataset x backbone) with the one trainer."""

HELP = "train a run (runs/DATASET/RUN, named by its run key) or a run config; resumes from its last.pt"


def add_arguments(p):
    p.add_argument("--run", metavar="RUN_DIR",
                   help="a run directory of the layout: runs/DATASET/RECIPE, runs/DATASET/exp/EXPERIMENT/VARIANT or "
                        "runs/DATASET/bench/BENCHMARK/VARIANT/sSEED; its config is resolved from its run key "
                        "(what the workflow runs)")
    p.add_argument("--config", help="run config YAML (or --experiment + --variant)")
    p.add_argument("--experiment", help="experiment file or name (config/experiments/NAME.yaml): train one variant")
    p.add_argument("--variant", help="with --experiment: the variant to train")
    p.add_argument("--dataset", help="with --experiment: dataset (default: the experiment's first)")
    p.add_argument("--out-dir", help="run directory (checkpoints, history, config); with --run: that directory")
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY.PATH=VALUE", help="config overrides")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads of the training (the workflow passes the cores Snakemake gives the job); "
                        "default: the run's train.threads, else torch's; never more than the CPUs this process may "
                        "use")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT_DIR/last.pt exists")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--log", metavar="FILE",
                   help="also append everything this command prints to FILE (the workflow's logs/train/...): a "
                        "training resumed after Ctrl-C or a kill keeps its earlier epochs above its own")
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="DDP processes (GPUs) per node; > 1 starts them with --launcher (xmr/train/distributed.py)")
    p.add_argument("--nnodes", type=int, default=1, metavar="M", help="nodes (several need SLURM)")
    p.add_argument("--launcher", default="auto", choices=["auto", "srun", "torchrun"],
                   help="auto: srun inside a SLURM job, else torchrun --standalone")


def _source(args) -> list[str]:
    """The run config's source as CLI arguments (--run, --config, or --experiment/--variant/--dataset)."""
    from xmr.core.errors import XmrError

    if args.run:
        if args.config or args.experiment or (args.out_dir and args.out_dir != args.run):
            raise XmrError("--run RUN_DIR names both the config and the run directory: drop --config/--experiment/"
                           "--out-dir")
        args.out_dir = args.run
        return ["--run", args.run]
    if not args.out_dir:
        raise XmrError("give --run RUN_DIR, or --out-dir DIR with --config FILE (or --experiment/--variant)")
    if bool(args.config) == bool(args.experiment) or bool(args.experiment) != bool(args.variant):
        raise XmrError("give either --run RUN_DIR, --config FILE or --experiment FILE --variant NAME")
    if args.config:
        return ["--config", args.config]
    return ["--experiment", args.experiment, "--variant", args.variant] + (["--dataset", args.dataset]
                                                                          if args.dataset else [])


def run(args):
    import os
    import sys

    from xmr.core.errors import XmrError

    if args.threads is not None and args.threads < 1:
        raise XmrError(f"--threads {args.threads}: give a positive number of CPU threads")
    # before torch (and its OpenMP) loads: on a machine other programs keep busy, threads that wait for each other
    # sleep instead of spinning, so that a core another program holds does not stall every step (docs/pipeline.md).
    # Once torch is loaded OpenMP has read its settings, and the variable would only leak into this process's later
    # children: leave it alone then, and whenever the user set it.
    if "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        from xmr.core.cpus import available_cpus, busy_cpus, wait_policy_for

        # no --threads: torch takes one per CPU this process may use
        policy = wait_policy_for(args.threads or available_cpus(), busy_cpus(), os.cpu_count() or 1)
        if policy:
            os.environ["OMP_WAIT_POLICY"] = policy
    if args.log:
        from xmr.core.progress import append_output_to

        append_output_to(args.log)
    source = _source(args)  # before torch is imported: a wrong combination of options fails at once
    from xmr.train import distributed

    if args.nproc_per_node * args.nnodes > 1 and not distributed.already_launched():
        check_inputs(_config(args))  # a missing dataset is xmr's one line here, not a launcher traceback after it
        child = ["train", *source] + ([] if args.run else ["--out-dir", args.out_dir])
        child += (["--set", *args.set] if args.set else []) + (["--no-resume"] if args.no_resume else [])
        child += ["--no-progress"] if args.no_progress else []
        # the job's threads shared by the processes of a node
        child += ["--threads", str(max(1, args.threads // args.nproc_per_node))] if args.threads else []
        child += ["--log", args.log] if args.log else []  # each process appends what it prints
        from xmr.run.lock import launcher_run_lock

        with launcher_run_lock(args.out_dir):  # one lock per training: the children's rank 0 takes none
            return distributed.relaunch(child, args.nproc_per_node, args.nnodes, args.launcher)

    from xmr.train.trainer import train

    cfg = _config(args)
    if args.threads:  # bookkeeping: not part of the run's digest, so a run resumes whatever cores it gets
        cfg["train"]["threads"] = args.threads
    from xmr.run.config import command_line_epochs

    note = command_line_epochs(cfg, args.set)
    if note:
        print(f"xmr train: {note}", flush=True)
    summary = train(cfg, args.out_dir, resume=not args.no_resume, progress=not args.no_progress)
    if summary["best_epoch"] > 0:  # DDP: only rank 0 validates
        print(f"best validation RSUM {summary['best_val_rsum']:.1f} at epoch {summary['best_epoch']} -> {args.out_dir}")


def _config(args) -> dict:
    """The run config of --run, --experiment/--variant or --config, with the --set overrides."""
    from xmr.run.config import load_run_config

    if args.run:
        from xmr.planning.workflow_inputs import run_config
        from xmr.run.layout import RunKey

        return run_config(RunKey.from_run_dir(args.run), args.set)
    if args.experiment:
        from xmr.studies.experiments import load_experiment, resolve_variant

        return resolve_variant(load_experiment(args.experiment), args.variant, args.dataset, extra=args.set)
    return load_run_config(args.config, user_set=args.set)


def check_inputs(cfg: dict) -> None:
    """Before DDP processes are launched: the dataset's annotations exist (what every process would read first)."""
    from xmr.core.io import require_file

    ds = cfg["dataset_cfg"]
    if ds.get("annotations"):
        require_file(ds["annotations"], ds.get("obtain", "see docs/datasets.md"))
