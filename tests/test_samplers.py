"""Batch composition (xmr/train/samplers.py) and DDP's gathered loss (xmr/train/distributed.gather_batch); two CPU
processes (gloo) against one on the same global batch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.train.samplers import OnePerClassBatchSampler, first_appearances, positive_mask
from xmr.settings.run_settings import run_settings

# 10 pairs of 4 classes: class 0 has pairs 0-3, class 1 pairs 4-5, class 2 pairs 6-8, class 3 pair 9
CLASSES = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 3])


def test_one_per_class_batches_have_distinct_classes_and_epoch_length():
    s = OnePerClassBatchSampler(CLASSES, batch_size=4, seed=3)
    batches = list(s)
    assert len(s) == len(batches) == 10 // 4  # PCME's adjust_epoch: n_items // batch_size batches
    for b in batches:
        assert len(b) == 4 and len(set(CLASSES[b])) == 4  # every class once
    assert batches == list(OnePerClassBatchSampler(CLASSES, batch_size=4, seed=3))  # seeded
    three = list(OnePerClassBatchSampler(CLASSES, batch_size=3, seed=0))
    assert len(three) == 3 and all(len(set(CLASSES[b])) == 3 for b in three)  # fewer classes than exist


def test_one_per_class_splits_batches_over_processes():
    full = list(OnePerClassBatchSampler(CLASSES, batch_size=2, seed=5))  # 5 batches
    r0 = list(OnePerClassBatchSampler(CLASSES, batch_size=2, seed=5, rank=0, world_size=2))
    r1 = list(OnePerClassBatchSampler(CLASSES, batch_size=2, seed=5, rank=1, world_size=2))
    assert r0 == full[0::2] and r1 == full[1::2]
    assert len(OnePerClassBatchSampler(CLASSES, 2, 5, rank=1, world_size=2)) == 2


def test_one_per_class_needs_enough_classes():
    with pytest.raises(XmrError, match=r"train.batch_size: 5 > 4 training classes"):
        OnePerClassBatchSampler(CLASSES, batch_size=5, seed=0)


def test_positive_masks_by_hand():
    idx = torch.tensor([7, 7, 2, 9])      # pairs 0 and 1 share image 7
    labels = torch.tensor([1, 1, 3, 1])   # images 7 and 9 share class 1
    t, f = True, False
    assert positive_mask(idx, labels, "image", True).tolist() == [[t, t, f, f], [t, t, f, f], [f, f, t, f],
                                                                  [f, f, f, t]]
    assert positive_mask(idx, labels, "class", True).tolist() == [[t, t, f, t], [t, t, f, t], [f, f, t, f],
                                                                  [t, t, f, t]]
    assert positive_mask(idx, labels, "class", False).tolist() == torch.eye(4, dtype=torch.bool).tolist()
    with pytest.raises(XmrError, match="train.positives: class needs class labels"):
        positive_mask(idx, None, "class", True)


def test_caption_text_positives_by_hand():
    from xmr.data.base import CaptionedSplit
    from xmr.train.samplers import caption_texts

    # image 0: "a red circle", "A  red circle" (same words), "a blue square"; image 1: "a blue square", "a star";
    # image 2: "a green star"
    caps = ["a red circle", "A  red circle", "a blue square", "a blue square", "a star", "a green star"]
    data = CaptionedSplit("toy", "train", ["0", "1", "2"], [], caps, np.array([0, 0, 0, 1, 1, 2]))
    texts = caption_texts(data)
    assert texts.caption_text.tolist() == [0, 0, 1, 1, 2, 3]
    assert texts.image_texts.tolist() == [[0, 0, 1], [1, 2, -1], [3, -1, -1]]
    # batch pairs (image, caption): (0, 0), (1, 3), (1, 4), (2, 5), (0, 2)
    idx, cap = torch.tensor([0, 1, 1, 2, 0]), torch.tensor([0, 3, 4, 5, 2])
    t, f = True, False
    # row i (image idx[i]) x column j (caption cap[j]): positive when cap[j]'s text is one of image idx[i]'s
    # captions. Image 0 has "a blue square", so caption 3 (image 1) is a positive for it, and caption 2 (image 0)
    # is one for image 1; "a star" (image 1) is not "a green star" (image 2).
    want = [[t, t, f, f, t],
            [f, t, t, f, t],
            [f, t, t, f, t],
            [f, f, f, t, f],
            [t, t, f, f, t]]
    assert positive_mask(idx, None, "caption_text", True, cap, texts).tolist() == want
    assert positive_mask(idx, None, "caption_text", False, cap, texts).tolist() == torch.eye(5).bool().tolist()
    with pytest.raises(XmrError, match="train.positives: caption_text needs the batch's caption indices"):
        positive_mask(idx, None, "caption_text", True)


def test_trainer_runs_one_per_class_with_class_positives(tiny_synth, tmp_path):
    from xmr.run.config import load_run_config
    from xmr.train.trainer import train

    # tiny synth: 48 images x 5 captions, labelled with their main shape (fewer classes than pairs)
    recipe = tiny_synth.recipe("vsepp", name="vsepp_cls", train={"sampler": "one_per_class", "positives": "class",
                                                                  "batch_size": 3})
    cfg = load_run_config(recipe)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["history"][0]["epoch"] == 1 and np.isfinite(summary["history"][0]["loss"])


def test_trainer_masks_duplicate_caption_texts(tiny_synth, tmp_path, monkeypatch):
    """With train.positives: caption_text every loss call gets the mask of the batch's own caption texts: a
    caption with the same words as one of image i's captions is a positive for image i, whatever its image."""
    from xmr.run.config import load_run_config
    from xmr.data import load_split
    from xmr.methods.vsepp import VSEPP
    from xmr.train.trainer import train

    recipe = tiny_synth.recipe("vsepp", name="vsepp_text", train={"positives": "caption_text", "batch_size": 60,
                                                                   "epochs": 1})
    cfg = load_run_config(recipe)
    import xmr.train.trainer as trainer_module

    def with_duplicate(split):
        """Image 1's first caption repeats image 0's word for word (synth v2 captions rarely repeat by chance)."""
        c = split.captions_per_image
        split.captions[c], split.tokens[c] = split.captions[0], list(split.tokens[0])
        return split

    load_images = trainer_module.load_split_images
    monkeypatch.setattr(trainer_module, "load_split_images", lambda image, dataset, split, train=False: (
        (lambda d, f: (with_duplicate(d) if split == "train" else d, f))(*load_images(image, dataset, split, train))))
    data = with_duplicate(load_split(cfg["dataset_cfg"], "train"))
    norm = [" ".join(t).lower() for t in data.tokens]
    own = [set() for _ in range(data.num_images)]
    for j, i in enumerate(data.caption_image):
        own[i].add(norm[j])
    seen = []
    original = VSEPP.compute_loss

    def spy(self, fwd, pos_mask, epoch):
        seen.append(pos_mask.cpu())
        return original(self, fwd, pos_mask, epoch)

    monkeypatch.setattr(VSEPP, "compute_loss", spy)
    from xmr.inference import loaders as train_data_module
    batches = []
    collate = train_data_module.PairCollate.__call__

    def keep(self, items):
        b = collate(self, items)
        if self.split == "train":
            batches.append((b["image_index"].clone(), b["caption_index"].clone()))
        return b

    monkeypatch.setattr(train_data_module.PairCollate, "__call__", keep)
    train(cfg, tmp_path / "run", progress=False)
    assert len(seen) == len(batches) > 0
    extra = 0
    for mask, (idx, cap) in zip(seen, batches):
        want = torch.tensor([[norm[c] in own[i] for c in cap.tolist()] for i in idx.tolist()])
        assert mask.tolist() == want.tolist()
        extra += int((want & (idx[:, None] != idx[None, :])).sum())
    assert extra > 0  # the repeated caption makes the text mask differ from the image mask


def _gather_inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"img": torch.randn(6, 4, generator=g), "txt": torch.randn(6, 4, generator=g)}


def _gathered_loss_step(rank: int, inputs: dict) -> dict:
    """In a process of the group: a DDP-wrapped linear layer on this rank's 3 of the 6 pairs, the batches gathered
    (gather_batch) before the triplet loss; its loss and the averaged gradient."""
    from xmr.losses.triplet import triplet_loss
    from xmr.train.distributed import gather_batch

    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))  # same init on both ranks
    rows = slice(rank * 3, (rank + 1) * 3)
    img, txt = gather_batch(net(inputs["img"][rows])), gather_batch(net(inputs["txt"][rows]))
    loss = triplet_loss(img @ txt.t(), torch.eye(6, dtype=torch.bool), margin=0.2)
    loss.backward()
    return {"loss": loss.detach(), "grad": net.module.weight.grad.clone()}


def test_gathered_loss_gradient_equals_one_process_on_the_global_batch(two_process_results):
    """Two gloo processes with 3 pairs each and train.gather_negatives: DDP's averaged gradient equals the gradient
    of the same loss computed by one process on all 6 pairs."""
    from xmr.losses.triplet import triplet_loss

    inputs = _gather_inputs()
    got = torch.load(two_process_results / "gather.rank0.pt")
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    ref = triplet_loss(net(inputs["img"]) @ net(inputs["txt"]).t(), torch.eye(6, dtype=torch.bool), margin=0.2)
    ref.backward()
    assert torch.allclose(got["loss"], ref.detach(), atol=1e-6)
    assert torch.allclose(got["grad"], net.weight.grad, atol=1e-6)
    assert net.weight.grad.abs().sum() > 0  # the comparison is not between two zero gradients


def test_gather_negatives_is_refused_for_methods_with_per_batch_state(tiny_synth, tmp_path):
    from xmr.run.config import load_run_config
    from xmr.train.trainer import train

    recipe = tiny_synth.recipe("coder", name="coder_gather", train={"gather_negatives": True})
    with pytest.raises(XmrError, match="train.gather_negatives: method coder keeps per-batch state"):
        train(load_run_config(recipe), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written


STEP_ROOT = Path(__file__).resolve().parents[1]
SHRINK = ["train.gather_negatives=true", "optim.grad_clip=null", "model.embed_dim=16", "text.word_vectors=null",
          "text.word_dim=8"]
# each method's synth recipe, shrunk; random augmentations and dropout off (their draws differ between 1 and 2
# processes); DVSE with the dynamic mask's centring on, whose running mean is all-reduced across processes.
STEP_METHODS = {
    "vsepp": SHRINK,
    # DVSE (as DivE below) without the residual MLP's BatchNorm and without its random drops, which differ per process
    "dvse": SHRINK + ["model.attention_hidden=8", "model.num_embeds=3", "model.dynamic_mask.center=true",
                      "model.residual_mlp=false", "model.size_augment.mode=none", "model.text_augment=0"],
    "pvse": SHRINK + ["model.attention_hidden=8"],
    # DivE without its residual MLP: BatchNorm's batch statistics stay per process under DDP (docs/pipeline.md)
    "dive": SHRINK + ["model.dim_head=4", "model.heads=2", "model.dropout=0", "model.text_augment=0",
                      "model.text_dropout=0", "model.size_augment.mode=none", "model.image_residual_mlp=false"],
}
# train.batch_by: image: 4 images with 2 captions each (pair p is image p // 2), each process 2 whole images
STEP_METHODS["dive_by_image"] = STEP_METHODS["dive"] + ["train.batch_by=image"]


def _one_train_step(ctx, rows: slice, inputs: dict) -> dict:
    """The trainer's own step (TrainStep; DDP-wrapped when ``ctx`` is enabled) of a method's synth recipe, shrunk,
    on pairs ``rows`` of ``inputs``: the loss terms, each parameter's gradient and value after the optimizer step,
    and the buffers."""
    from xmr.run.config import load_run_config
    from xmr.text.vocab import SPECIALS
    from xmr.train.step import TrainForward, TrainStep, build_optimizer
    from xmr.inference.model import model_from_config
    from xmr.core.utils import seed_everything

    method = inputs["method"]
    cfg = load_run_config(str(STEP_ROOT / f"config/recipes/synth/{method.removesuffix('_by_image')}.yaml"),
                          STEP_METHODS[method])
    seed_everything(0)  # the same initial weights in every process
    model = model_from_config(cfg, 8, SPECIALS + inputs["words"])
    step = TrainStep(model, ctx.wrap(TrainForward(model)), build_optimizer(model, cfg["optim"]),
                     torch.amp.GradScaler("cuda", enabled=False), run_settings(cfg),
                     cfg["optim"]["grad_clip"], torch.device("cpu"))
    tokens = inputs["tokens"][rows]
    idx = torch.arange(len(inputs["tokens"]))[rows]
    batch = {"feats": inputs["feats"][rows], "num_regions": inputs["num_regions"][rows],
             "text": model.text.collate([" ".join(t) for t in tokens], tokens, idx.tolist(), "train"),
             "image_index": idx, "caption_index": idx}
    if run_settings(cfg).batching.batch_by == "image":  # each image once, its captions' rows pointing at it
        images, image_rows = first_appearances((idx // 2).tolist())
        batch.update(feats=inputs["feats"][images], num_regions=inputs["num_regions"][images],
                     image_index=idx // 2, image_rows=torch.tensor(image_rows))
    terms = step(batch, 0, 0, 1)
    return {"terms": {k: v.detach() for k, v in terms.items()},
            "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "buffers": {n: b.clone() for n, b in model.named_buffers()}}


def _step_inputs(method: str) -> dict:
    """An 8-pair batch for ``method``'s step: region features, 4-word captions over a 12-word vocabulary."""
    g = torch.Generator().manual_seed(3)
    words = [f"w{i}" for i in range(12)]
    tokens = [[words[int(k)] for k in torch.randint(0, 12, (4,), generator=g)] for _ in range(8)]
    return {"feats": torch.randn(8, 4, 8, generator=g), "num_regions": torch.full((8,), 4), "tokens": tokens,
            "words": words, "method": method}


def _two_process_worker(rank: int, world: int, port: int, out: str) -> None:
    """One process of a 2-process gloo group (the trainer's own set-up): each method's step on its half of the
    batch, then the gathered loss; every result saved per rank. One group for all cases: starting two
    interpreters that import torch and xmr is most of each case's time."""
    from xmr.train import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = distributed.setup()  # gloo on CPU
    for method in STEP_METHODS:
        inputs = _step_inputs(method)
        half = len(inputs["tokens"]) // world
        try:
            res = _one_train_step(ctx, slice(rank * half, (rank + 1) * half), inputs)
        except Exception as e:  # which case broke the group: every test of the fixture reports it
            raise RuntimeError(f"rank {rank}, method {method}: {e!r}") from e
        torch.save(res, Path(out) / f"{method}.rank{rank}.pt")
    res = _gathered_loss_step(rank, _gather_inputs())
    if rank == 0:
        torch.save(res, Path(out) / "gather.rank0.pt")
    distributed.cleanup(ctx)


@pytest.fixture(scope="module")
def two_process_results(module_tmp) -> Path:
    """The folder of what :func:`_two_process_worker`'s two processes saved: ``{method}.rank{r}.pt`` for each of
    STEP_METHODS and ``gather.rank0.pt``."""
    import torch.multiprocessing as mp

    out = module_tmp("two_processes")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_process_worker, args=(2, port, str(out)), nprocs=2, join=True)
    return out


@pytest.mark.parametrize("method", list(STEP_METHODS))
def test_two_processes_train_step_equals_one_process_on_the_global_batch(method, two_process_results):
    """#16: two gloo processes, each with half of an 8-pair batch, run the trainer's step (DDP wrapper, gradient
    all-reduce, gather_negatives: hardest negatives and the set regularisers over all 8 pairs): every loss term,
    the averaged gradients and the buffers (DVSE's running mean) equal one process's step on all 8 pairs, on both
    ranks, and both ranks hold the same weights after the optimizer step."""
    from xmr.train.distributed import DistContext

    inputs = _step_inputs(method)
    ranks = [torch.load(two_process_results / f"{method}.rank{r}.pt") for r in range(2)]
    one = _one_train_step(DistContext(), slice(0, 8), inputs)
    assert one["grads"].keys() == ranks[0]["grads"].keys() and len(one["grads"]) > 3
    for got in ranks:
        assert got["terms"].keys() == one["terms"].keys()
        for name, value in one["terms"].items():
            assert torch.allclose(got["terms"][name], value, atol=1e-5), name
        for name, grad in one["grads"].items():
            assert torch.allclose(got["grads"][name], grad, atol=1e-5), name
        for name, buf in one["buffers"].items():
            assert torch.allclose(got["buffers"][name].float(), buf.float(), atol=1e-6), name
    # the replicas stay identical after the optimizer step (against one process, Adam's first step g / |g| turns
    # float noise in near-zero gradients into whole steps, so the weights are compared between the ranks)
    for name, value in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], value), name
    assert sum(float(g.abs().sum()) for g in one["grads"].values()) > 0


def test_distributed_sampler_splits_an_epoch_between_processes():
    # each process gets a disjoint half of the shuffled pairs; together they are the epoch, every pair once
    from xmr.train.distributed import DistContext

    data = list(range(10))
    parts = [list(DistContext(True, rank, 2).sampler(data, seed=7)) for rank in range(2)]
    assert len(parts[0]) == len(parts[1]) == 5
    assert sorted(parts[0] + parts[1]) == data
    assert parts != [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]  # shuffled, not strided over the unshuffled order
    assert parts == [list(DistContext(True, rank, 2).sampler(data, seed=7)) for rank in range(2)]  # seeded
