"""xmr search: top-k retrieval with a trained run (text -> images of a split, or image -> captions)."""

import sys

HELP = ("search a split of the run's dataset with a text (-> images) or an image file (-> captions); "
        "prints scores with image ids and files, or captions")


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory, checkpoint (.pt) or MLflow run id")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--text", action="append", help="a caption query (repeat for several); an empty one is an "
                   "error, one with no word the model's vocabulary knows gets a warning on stderr (its hits are "
                   "still printed)")
    q.add_argument("--image", action="append", help="an image file query (repeat for several); when it is an image "
                   "of the split, its own captions among the hits are marked")
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
    for text in args.text or ():
        if not text.strip():
            raise XmrError(f"--text {text!r}: an empty query; give the words to search for")
    model = load(args.run, args.device)
    for text in args.text or ():
        if model.known_words(text) == []:
            # a warning, not a refusal: the hits are still printed (as the model scores <unk>), but not trusted
            print(f"xmr search: warning: --text {text!r}: no word of it is in the model's vocabulary (the words of "
                  f"its training captions); each reads as <unk>, so its hits say nothing about the query",
                  file=sys.stderr)
    gallery = model.encode_split(args.split)
    own: list[int | None] = []
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
        own = gallery_rows_of(args.image, gallery["image_paths"])
    for n, (q, (row, srow)) in enumerate(zip(labels, zip(idx, scores))):
        print(f"query: {q}  ({gallery['split']} split, {model.method})")
        query_image = own[n] if own else None
        for rank, (j, s) in enumerate(zip(row, srow), 1):
            mine = query_image is not None and gallery["caption_image"][j] == query_image
            print(f"{rank:3d}  {s: .4f}  {names[j]}" + ("  [a caption of the query image]" if mine else ""))


def gallery_rows_of(images: list[str], gallery_paths: list[str] | None) -> list[int | None]:
    """The gallery row of each query image file that is one of the split's own images (the same file, however
    its path is written), else None: its own captions are marked among the hits."""
    import os

    rows = {os.path.realpath(p): i for i, p in enumerate(gallery_paths or ())}
    return [rows.get(os.path.realpath(image)) for image in images]
