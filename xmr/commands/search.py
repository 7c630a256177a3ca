"""xmr search: top-k retrieval with a trained run (text -> images of a split, or image -> captions)."""

HELP = ("search a split of the run's dataset with a text (-> images) or an image file (-> captions); "
        "prints scores with image ids and files, or captions")


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory, checkpoint (.pt) or MLflow run id")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--text", action="append", help="a caption query (repeat for several)")
    q.add_argument("--image", action="append", help="an image file query (repeat for several)")
    p.add_argument("--k", type=int, default=5, help="results per query (default 5)")
    p.add_argument("--split", help="gallery split (default: the dataset's test split)")
    p.add_argument("--rerank", help="a registered re-ranker applied to the query x gallery scores (e.g. fr, dsl); the split's "
                        "embeddings of the queries' modality are re-ranked with the queries, as in evaluation")
    p.add_argument("--device", default="auto")


def run(args):
    from xmr.core.errors import XmrError
    from xmr.inference.model import load

    if args.k < 1:
        raise XmrError(f"--k {args.k}: must be at least 1")
    model = load(args.run, args.device)
    gallery = model.encode_split(args.split)
    if args.text:
        queries, labels = model.encode_text(args.text), args.text
        idx, scores = model.search(queries, gallery["image_emb"], args.k, args.rerank, queries_are="text",
                                   reference=gallery["text_emb"])
        paths = gallery["image_paths"]  # the file to open beside each id; a features-only dataset has none
        names = [f"{i}  {p}" for i, p in zip(gallery["image_ids"], paths)] if paths else gallery["image_ids"]
    else:
        queries, labels = model.encode_image(args.image), args.image
        idx, scores = model.search(queries, gallery["text_emb"], args.k, args.rerank, queries_are="image",
                                   reference=gallery["image_emb"])
        names = [f"{gallery['image_ids'][i]}: {c}" for i, c in zip(gallery["caption_image"], gallery["captions"])]
    for q, (row, srow) in zip(labels, zip(idx, scores)):
        print(f"query: {q}  ({gallery['split']} split, {model.method})")
        for rank, (j, s) in enumerate(zip(row, srow), 1):
            print(f"{rank:3d}  {s: .4f}  {names[j]}")
