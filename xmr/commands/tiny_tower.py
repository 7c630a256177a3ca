"""xmr tiny-tower: a random-initialised transformers tower at toy size, saved with save_pretrained into a folder."""

HELP = ("save a random-initialised toy transformers tower (ViT, CLIP, SigLIP, DINOv2) and its image processor into a "
        "folder, for the synth recipes and tests that need no downloaded weights")


def add_arguments(p):
    from xmr.models.tiny_towers import FAMILIES

    p.add_argument("--family", required=True, choices=FAMILIES)
    p.add_argument("--out", required=True, help="the folder to write (e.g. resources/models/clip-tiny-random)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)


def run(args):
    from xmr.core.errors import XmrError
    from xmr.models.tiny_towers import save_tiny_tower

    if args.image_size % args.patch_size:
        raise XmrError(f"--image-size {args.image_size} is not a multiple of --patch-size {args.patch_size}")
    out = save_tiny_tower(args.family, args.out, image_size=args.image_size, patch_size=args.patch_size,
                          hidden=args.hidden, layers=args.layers, seed=args.seed)
    print(f"wrote {out}/config.json, model.safetensors, preprocessor_config.json")
