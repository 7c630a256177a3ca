"""xmr score-bank: QB-Norm's query bank of a trained run (bank queries from a non-test split)."""

HELP = "similarities of bank queries (a non-test split) to the test gallery, for the qbnorm re-ranker"


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory written by `xmr train`")
    p.add_argument("--split", default="train", help="split the bank queries come from (default: train)")
    p.add_argument("--max-images", type=int, default=5000,
                   help="bank = the first N images of the split and their captions (default 5000; 0 = all)")
    p.add_argument("--out-i2t", required=True, help="bank images x test captions (.npy)")
    p.add_argument("--out-t2i", required=True, help="test images x bank captions (.npy)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    import numpy as np

    from xmr.core.io import atomic_path
    from xmr.inference.model import score_bank

    i2t, t2i, info = score_bank(args.run, args.split, args.max_images or None, args.device,
                                progress=not args.no_progress)
    for path, arr in ((args.out_i2t, i2t), (args.out_t2i, t2i)):
        with atomic_path(path, ".npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, arr)
    print(f"wrote {args.out_i2t} ({i2t.shape[0]} x {i2t.shape[1]}) and {args.out_t2i} ({t2i.shape[0]} x "
          f"{t2i.shape[1]}): bank of {info['bank_images']} {info['bank_split']} images, {info['bank_captions']} captions")
