"""xmr score: similarity matrix of a trained run on a split (rows = images, columns = captions)."""

HELP = "compute the test (or any split's) similarity matrix of a trained run and save it as .npy"


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory written by `xmr train`")
    p.add_argument("--split", help="default: the dataset's test split")
    p.add_argument("--dataset", help="another dataset's split (config/datasets/NAME.yaml), its features under the "
                                     "run's features.dir: synth_dev for a synth run, or a transfer test (coco -> f30k)")
    p.add_argument("--out", required=True, help="output .npy")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    from xmr.commands.similarity import add_element_arguments

    add_element_arguments(p)


def run(args):
    import numpy as np

    from xmr.core.io import atomic_path
    from xmr.run.config import load_saved_config

    load_saved_config(args.run)  # a missing or unreadable run directory fails in one line, before torch loads
    from xmr.commands.similarity import kept_elements
    from xmr.inference.model import score_split

    sims, info = score_split(args.run, args.split, args.device, progress=not args.no_progress,
                             select_elements=lambda img, cap: kept_elements(args, img, cap), dataset=args.dataset)
    with atomic_path(args.out, ".npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, sims)
    print(f"wrote {args.out} ({info['num_images']} x {info['num_captions']}, {info['dataset']} split {info['split']})")
