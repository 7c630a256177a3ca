"""Training-throughput benchmark of VSE∞ (not a test; figures go to docs/speed.md "Training throughput").

Samples/s of one VSE∞ training step on precomputed 36 x 2048 region features with a BiGRU text encoder,
batch 128, against a straightforward step written the way the reference code (woodfrog/vse_infty, ``bigru``
branch: ``lib/encoders.py``, ``lib/modules/aggr/gpo.py``, ``lib/loss.py``, ``lib/vse.py``) does it, in the same
process, on the same data, shapes and dtype. Target: xmr no slower than the reference-style step.

Variants (all on the same seeded random batches, cycled; warm-up steps excluded):

- ``xmr``: the model from ``--config`` (default ``config/recipes/coco/vse_inf.yaml``, through ``xmr.config.loader`` and
  ``METHODS``) and the trainer's own step (``TrainStep`` in ``xmr/train/step.py``): lr schedule, both encoders in one
  forward under autocast, ``compute_loss`` (hardest negative, as after the warm-up epoch), finiteness check,
  backward, ``clip_grad_norm_`` 2.0, AdamW step, ``loss.item()``. VSE∞'s training augmentations (region drop 0.2,
  caption token augmentation 0.2) run inside this step, as in the trainer.
- ``xmr_noaug``: the same with both augmentations off, fed the pre-augmented batches the reference-style step
  gets (the reference augments in its DataLoader workers, outside the step): the like-for-like compute comparison.
- ``reference``: written from scratch here after the reference's structure: FC + BN-MLP residual, GPO running its
  BiGRU over one rank-encoding sequence per sample (``pack_padded_sequence``) and ``torch.sort`` over the regions,
  BiGRU text over length-sorted captions (``pack_padded_sequence``), ``ContrastiveLoss`` with ``max_violation``,
  ``clip_grad_norm_`` 2, AdamW. Its inputs are augmented beforehand (untimed), like its DataLoader does.
- ``xmr_nanfill`` (only when asked for with ``--variants``): ``xmr`` with deterministic mode's NaN fill of every
  new tensor switched back on (``train.fill_uninitialized_memory: true``), which every variant otherwise runs
  without, as the trainer does: what the fill costs a step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train.py --threads 1      # CPU, 1 thread
    .venv/bin/python benchmarks/bench_train.py                                    # CPU, torch's default threads
    .venv/bin/python benchmarks/bench_train.py --device cuda --iters 50 --json out.json
    .venv/bin/python benchmarks/bench_train.py --device cuda --sync-debug --profile 5    # where the host waits
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("xmr", "xmr_noaug", "reference", "xmr_nanfill")
DEFAULT_VARIANTS = VARIANTS[:3]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "config/recipes/coco/vse_inf.yaml"),
                    help="a vse_inf run config (default: the COCO BUTD + BiGRU recipe)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                    help="autocast for every variant: auto = the config's train.amp, CUDA only (as the trainer)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--regions", type=int, default=36)
    ap.add_argument("--feature-dim", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=10000, help="words besides the 4 specials")
    ap.add_argument("--min-words", type=int, default=8)
    ap.add_argument("--max-words", type=int, default=20)
    ap.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per variant before each timing")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="timings per variant (interleaved); the median is kept")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-memory", action="store_true", help="skip the per-variant peak-memory subprocesses")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="also run torch.profiler over STEPS steps of each variant and print the top ops")
    ap.add_argument("--sync-debug", action="store_true",
                    help="CUDA: list where one step of each variant makes the host wait for the device")
    ap.add_argument("--json", default=None, help="also write the results here")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and usage errors answer before torch loads (seconds)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

sys.path.insert(0, str(ROOT))

from xmr.run.config import load_run_config  # noqa: E402
from xmr.core.errors import XmrError  # noqa: E402
from xmr.core.reproducibility import use_deterministic_algorithms  # noqa: E402
from xmr.text.vocab import SPECIALS, UNK  # noqa: E402
from xmr.inference.loaders import PairCollate  # noqa: E402
from xmr.train.step import TrainForward, TrainStep, build_optimizer  # noqa: E402
from xmr.train.trainer import host_sync_every  # noqa: E402
from xmr.inference.model import model_from_config  # noqa: E402
from xmr.settings.run_settings import run_settings  # noqa: E402
from xmr.core.utils import resolve_device, seed_everything, tune_cpu_allocator  # noqa: E402

EMPTY_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}


# -- data ----------------------------------------------------------------------------------------------------------

def make_vocab(n_words: int) -> list[str]:
    return SPECIALS + [f"w{i:05d}" for i in range(n_words)]


def make_raw_batches(args, vocab_words: list[str]) -> list[list[tuple]]:
    """``--batches`` batches of ``(feats (R, F) float32, caption, tokens, image index)`` samples (seeded).

    Features are |N(0, 1)| (BUTD features are non-negative); captions have 8-20 words drawn uniformly from the
    vocabulary (COCO captions average about 10.5 words)."""
    rng = np.random.default_rng(args.seed)
    words = vocab_words[len(SPECIALS):]
    out = []
    for b in range(args.batches):
        feats = np.abs(rng.standard_normal((args.batch_size, args.regions, args.feature_dim), dtype=np.float32))
        samples = []
        for i in range(args.batch_size):
            n = int(rng.integers(args.min_words, args.max_words + 1))
            tokens = [words[k] for k in rng.integers(0, len(words), n)]
            samples.append((feats[i], " ".join(tokens), tokens, b * args.batch_size + i))
        out.append(samples)
    return out


def augment_like_reference_loader(samples: list[tuple], vocab_words: list[str], rng: np.random.Generator,
                                  p_region: float = 0.2, p_token: float = 0.2) -> list[tuple]:
    """What the reference's ``PrecompRegionDataset.__getitem__`` does in its workers: keep each region with
    prob 1 - p; per word with prob p: mask (50%, ``<unk>`` here), random word (10%) or delete (40%)."""
    words = vocab_words[len(SPECIALS):]
    out = []
    for feats, _, tokens, idx in samples:
        feats = feats[rng.random(len(feats)) > p_region]
        new = []
        for t in tokens:
            u = rng.random()
            if u >= p_token:
                new.append(t)
            elif u < 0.5 * p_token:
                new.append(UNK)
            elif u < 0.6 * p_token:
                new.append(words[rng.integers(len(words))])
            # else: deleted
        out.append((feats, " ".join(new), new, idx))
    return out


def xmr_batches(samples_list: list[list[tuple]], text_collate, pin: bool) -> list[dict]:
    """Batches as the trainer's DataLoader yields them (``PairCollate``: zero-padded regions + text collate)."""
    collate = PairCollate(text_collate, "train")
    out = []
    for samples in samples_list:
        items = [(torch.from_numpy(f), len(f), cap, toks, idx, idx) for f, cap, toks, idx in samples]
        b = collate(items)
        if pin:
            b = {k: (v.pin_memory() if torch.is_tensor(v) else v) for k, v in b.items()}
            b["text"] = {k: v.pin_memory() for k, v in b["text"].items()}
        out.append(b)
    return out


def reference_batches(samples_list: list[list[tuple]], vocab_words: list[str], pin: bool) -> list[dict]:
    """Batches as the reference's ``collate_fn`` builds them: sorted by caption length (longest first), ids with
    <start>/<end>, a Python list of caption lengths, regions zero-padded to the longest image of the batch."""
    from xmr.text.vocab import Vocabulary

    vocab = Vocabulary(vocab_words)
    out = []
    for samples in samples_list:
        ids = [vocab.encode(toks) for _, _, toks, _ in samples]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        cap_lengths = [len(ids[i]) for i in order]
        caps = torch.zeros(len(ids), cap_lengths[0], dtype=torch.long)
        img_lengths = [len(samples[i][0]) for i in order]
        images = torch.zeros(len(ids), max(img_lengths), samples[0][0].shape[1])
        for row, i in enumerate(order):
            caps[row, : len(ids[i])] = torch.tensor(ids[i])
            images[row, : img_lengths[row]] = torch.from_numpy(samples[i][0])
        b = {"images": images, "captions": caps, "lengths": cap_lengths, "image_lengths": torch.tensor(img_lengths)}
        if pin:
            b = {k: (v.pin_memory() if torch.is_tensor(v) else v) for k, v in b.items()}
        out.append(b)
    return out


# -- reference-style model (written after woodfrog/vse_infty's structure; no code taken from it) --------------------

def ref_l2norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    return x / (x.pow(2).sum(dim=-1, keepdim=True).sqrt() + eps)


def ref_sincos(dim: int, length: int) -> torch.Tensor:
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class RefGPO(nn.Module):
    """Per-sample GPO: a BiGRU over each sample's own rank encodings (packed), then a sort over the regions."""

    def __init__(self, d_pe: int = 32, d_hidden: int = 32) -> None:
        super().__init__()
        self.d_pe, self.d_hidden = d_pe, d_hidden
        self.gru = nn.GRU(d_pe, d_hidden, 1, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(d_hidden, 1, bias=False)
        self.pe_cache: dict[int, torch.Tensor] = {}

    def weights(self, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t, b = int(lengths.max()), lengths.size(0)
        if t not in self.pe_cache:
            self.pe_cache[t] = ref_sincos(self.d_pe, t)
        pes = self.pe_cache[t].unsqueeze(0).repeat(b, 1, 1).to(lengths.device)
        mask = (torch.arange(t).expand(b, t).to(lengths.device) < lengths.long().unsqueeze(1)).unsqueeze(-1)
        pes = pes.masked_fill(mask == 0, 0)
        self.gru.flatten_parameters()
        packed = pack_padded_sequence(pes, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True)
        out = (out[:, :, : self.d_hidden] + out[:, :, self.d_hidden:]) / 2
        scores = self.linear(out)
        scores[torch.where(mask == 0)] = -10000
        return torch.softmax(scores / 0.1, 1), mask

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        w, mask = self.weights(lengths)
        x = x[:, : int(lengths.max())]
        x = x.masked_fill(mask == 0, -10000).sort(dim=1, descending=True)[0].masked_fill(mask == 0, 0)
        return (x * w).sum(1)


class RefImageEncoder(nn.Module):
    """FC + (Linear-BN-ReLU-Linear) residual over the regions, GPO, L2 norm (``precomp_enc_type basic``)."""

    def __init__(self, img_dim: int, embed: int) -> None:
        super().__init__()
        self.fc = nn.Linear(img_dim, embed)
        r = math.sqrt(6.0) / math.sqrt(img_dim + embed)
        self.fc.weight.data.uniform_(-r, r)
        self.fc.bias.data.zero_()
        self.mlp_fc1, self.mlp_fc2 = nn.Linear(img_dim, embed // 2), nn.Linear(embed // 2, embed)
        self.mlp_bn1 = nn.BatchNorm1d(embed // 2)
        self.mlp_bn2 = nn.BatchNorm1d(embed)  # built but never applied in the reference MLP (kept: same params)
        self.gpool = RefGPO(32, 32)

    def forward(self, images: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, n, d = images.shape
        h = F.relu(self.mlp_bn1(self.mlp_fc1(images.reshape(b * n, d))))
        feats = self.fc(images) + self.mlp_fc2(h).view(b, n, -1)
        return ref_l2norm(self.gpool(feats, lengths))


class RefTextEncoder(nn.Module):
    """Word embeddings -> BiGRU over the packed, length-sorted batch -> directions averaged -> GPO -> L2 norm."""

    def __init__(self, vocab_size: int, word_dim: int, embed: int) -> None:
        super().__init__()
        self.embed_size = embed
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.embed.weight.data.uniform_(-0.1, 0.1)
        self.rnn = nn.GRU(word_dim, embed, 1, batch_first=True, bidirectional=True)
        self.gpool = RefGPO(32, 32)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(ids), lengths.cpu(), batch_first=True)
        out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True)
        out = (out[:, :, : self.embed_size] + out[:, :, self.embed_size:]) / 2
        return ref_l2norm(self.gpool(out, lengths))


def ref_contrastive_max_violation(im: torch.Tensor, s: torch.Tensor, margin: float) -> torch.Tensor:
    scores = im.mm(s.t())
    diagonal = scores.diag().view(im.size(0), 1)
    cost_s = (margin + scores - diagonal.expand_as(scores)).clamp(min=0)
    cost_im = (margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
    eye = (torch.eye(scores.size(0)) > 0.5).to(scores.device)
    cost_s = cost_s.masked_fill_(eye, 0)
    cost_im = cost_im.masked_fill_(eye, 0)
    return cost_s.max(1)[0].sum() + cost_im.max(0)[0].sum()


# -- steps -----------------------------------------------------------------------------------------------------------

class Bench:
    """One variant: its model, optimizer, batches and ``step(batch) -> loss``."""

    def __init__(self, name: str, modules: list[nn.Module], batches: list, step: Callable[[object], float],
                 nan_fill: bool = False) -> None:
        self.name, self.modules, self.batches, self.step = name, modules, batches, step
        self.nan_fill = nan_fill  # torch.utils.deterministic.fill_uninitialized_memory while this variant runs


def amp_settings(cfg: dict, device: torch.device, amp: str) -> tuple[bool, torch.dtype]:
    """The trainer's rule: autocast on CUDA when ``train.amp``, bf16 where supported else fp16."""
    use = (cfg["train"]["amp"] if amp == "auto" else amp == "on") and device.type == "cuda"
    dtype = torch.bfloat16 if use and torch.cuda.is_bf16_supported() else torch.float16
    return use, dtype


def load_cfg(args, augment: bool) -> dict:
    overrides = list(args.set)
    if not augment:
        overrides += ["model.size_augment.p=0", "model.text_augment=0"]
    cfg = load_run_config(args.config, overrides)
    if cfg["method"] != "vse_inf":
        raise XmrError(f"{args.config}: method {cfg['method']!r}; this benchmark times vse_inf")
    return cfg


def build_xmr(name: str, args, cfg: dict, vocab_words: list[str], samples_list, device: torch.device) -> Bench:
    seed_everything(cfg["train"]["seed"])
    model = model_from_config(cfg, args.feature_dim, vocab_words).to(device)
    model.train()
    optimizer = build_optimizer(model, cfg["optim"], fused=device.type == "cuda")  # as the trainer builds it
    use_amp, amp_dtype = amp_settings(cfg, device, args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    # the trainer's own step (xmr/train/step.py TrainStep); single process: the trainer's ctx.wrap is the identity
    stepper = TrainStep(model, TrainForward(model), optimizer, scaler, run_settings(cfg), cfg["optim"]["grad_clip"],
                        device, use_amp, amp_dtype)
    stepper.check_finite = host_sync_every(device) == 1  # as in train(): no host read of the loss per step on CUDA
    epoch, steps_per_epoch = int(cfg["loss"]["warmup_epochs"]), 1000  # first step after the VSE0 warm-up: hardest

    def step(batch: dict) -> torch.Tensor:  # the loss stays on the device; run_steps reads them after its sync
        return stepper(batch, epoch, 0, steps_per_epoch)["loss"].detach()

    return Bench(name, [model], xmr_batches(samples_list, model.text.collate, device.type == "cuda"), step,
                 nan_fill=name == "xmr_nanfill")


def build_reference(args, cfg: dict, vocab_words: list[str], samples_list, device: torch.device) -> Bench:
    seed_everything(cfg["train"]["seed"])
    embed = cfg["model"]["embed_dim"]
    img_enc = RefImageEncoder(args.feature_dim, embed).to(device).train()
    txt_enc = RefTextEncoder(len(vocab_words), cfg["text"]["word_dim"], embed).to(device).train()
    params = list(txt_enc.parameters()) + list(img_enc.parameters())
    lr, wd = cfg["optim"]["lr"], cfg["optim"]["weight_decay"]
    optimizer = torch.optim.AdamW([{"params": list(txt_enc.parameters()), "lr": lr},
                                   {"params": list(img_enc.parameters()), "lr": lr}], lr=lr, weight_decay=wd)
    use_amp, amp_dtype = amp_settings(cfg, device, args.amp)  # same dtype as xmr (the reference itself has no AMP)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    margin, clip = cfg["loss"]["margin"], cfg["optim"]["grad_clip"]

    def step(batch: dict) -> float:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            img_emb = img_enc(batch["images"].to(device), batch["image_lengths"].to(device))
            cap_emb = txt_enc(batch["captions"].to(device), torch.Tensor(batch["lengths"]).to(device))
            optimizer.zero_grad()
            loss = ref_contrastive_max_violation(img_emb, cap_emb, margin)
        value = loss.item()  # the reference logs it in forward_loss
        scaler.scale(loss).backward()
        if clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, clip)
        scaler.step(optimizer)
        scaler.update()
        return value

    return Bench("reference", [img_enc, txt_enc], reference_batches(samples_list, vocab_words,
                                                                     device.type == "cuda"), step)


def build(name: str, args, device: torch.device) -> Bench:
    """Build one variant on fresh seeded data (identical across variants and processes)."""
    vocab_words = make_vocab(args.vocab)
    raw = make_raw_batches(args, vocab_words)
    if name in ("xmr", "xmr_nanfill"):
        return build_xmr(name, args, load_cfg(args, augment=True), vocab_words, raw, device)
    rng = np.random.default_rng(args.seed + 1)
    augmented = [augment_like_reference_loader(s, vocab_words, rng) for s in raw]
    del raw
    if name == "xmr_noaug":
        return build_xmr(name, args, load_cfg(args, augment=False), vocab_words, augmented, device)
    return build_reference(args, load_cfg(args, augment=True), vocab_words, augmented, device)


# -- measurement -----------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_steps(bench: Bench, n: int, device: torch.device) -> tuple[float, float, list[float]]:
    """Wall and process CPU seconds of ``n`` steps over the variant's batches (from the first), and the losses."""
    torch.utils.deterministic.fill_uninitialized_memory = bench.nan_fill
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    losses = [bench.step(bench.batches[i % len(bench.batches)]) for i in range(n)]
    sync(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, [float(x) for x in losses]  # xmr's step returns device tensors: read after the clock


def setup_process(args, device: torch.device) -> None:
    """What the trainer sets up before training: allocator tuning on CPU, deterministic algorithms per config."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cpu":
        tune_cpu_allocator()
    tcfg = load_cfg(args, augment=True)["train"]
    if tcfg["deterministic"]:
        use_deterministic_algorithms(warn_only=True, fill_uninitialized_memory=tcfg["fill_uninitialized_memory"])


def peak_rss_bytes() -> int:
    """This process's peak resident memory: ``VmHWM`` on Linux, else ``getrusage``'s ``ru_maxrss``.

    ``ru_maxrss`` survives fork + exec, so a spawned child reports at least its parent's RSS at the fork;
    ``VmHWM`` belongs to the child's own address space."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def memory_child(name: str, args_dict: dict, queue) -> None:
    """Peak resident memory (and CUDA peak) of a fresh process that builds one variant and runs a few steps."""
    args = argparse.Namespace(**args_dict)
    device = torch.device(args.device)
    setup_process(args, device)
    bench = build(name, args, device)
    before = peak_rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    run_steps(bench, args.warmup + 2, device)
    peak = peak_rss_bytes()
    out = {"rss_before_steps_mib": before / 2**20, "peak_rss_mib": peak / 2**20}
    if device.type == "cuda":
        out["cuda_peak_over_inputs_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    queue.put(out)


def measure_memory(name: str, args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=memory_child, args=(name, vars(args), queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def host_syncs(bench: Bench, device: torch.device) -> list[str]:
    """``count  file:line`` of every synchronising CUDA call in one step (torch's sync debug mode)."""
    import collections
    import warnings

    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            bench.step(bench.batches[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync(device)
    where = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return [f"{n:4d}  {loc}" for loc, n in where.most_common()] or ["none"]


def profile(bench: Bench, steps: int, device: torch.device, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        run_steps(bench, steps, device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    # deterministic mode's NaN fills: aten::fill_ called by an allocation (one extra kernel each on a GPU)
    nan_fills = sum(e.name == "aten::fill_" and e.cpu_parent is not None and e.cpu_parent.name in EMPTY_OPS
                    for e in prof.events())
    return (prof.key_averages().table(sort_by=key, row_limit=rows)
            + f"\nNaN fills of new tensors (deterministic mode): {nan_fills / steps:.0f} per step")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = resolve_device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here; run on a GPU node or use cpu")
    args.device = str(device)
    setup_process(args, device)
    from bench_eval import machine

    info = machine()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    res: dict = {"machine": info, "device": str(device), "threads": torch.get_num_threads(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "config": args.config,
                 "overrides": args.set, "amp": amp_settings(load_cfg(args, True), device, args.amp)[0],
                 "shape": {"batch": args.batch_size, "regions": args.regions, "feature_dim": args.feature_dim,
                           "vocab": args.vocab + len(SPECIALS), "words": [args.min_words, args.max_words]},
                 "warmup": args.warmup, "iters": args.iters, "repeats": args.repeats,
                 "loadavg_start": os.getloadavg(), "variants": {}}
    print(f"# VSE∞ training step, batch {args.batch_size} x {args.regions} x {args.feature_dim}, BiGRU text, "
          f"{res['shape']['vocab']} words; {device}, {res['threads']} threads, amp {res['amp']}; "
          f"load average {res['loadavg_start'][0]:.1f}", flush=True)
    benches = {name: build(name, args, device) for name in args.variants}
    times: dict[str, list[dict]] = {name: [] for name in benches}
    names = list(benches)
    for r in range(args.repeats):  # interleaved, order rotated: slow phases of a shared machine hit every variant
        for name in names[r % len(names):] + names[: r % len(names)]:
            bench = benches[name]
            run_steps(bench, args.warmup, device)
            wall, cpu, losses = run_steps(bench, args.iters, device)
            if not all(math.isfinite(x) for x in losses):
                raise XmrError(f"{name}: non-finite loss {losses}")
            times[name].append({"wall_s": wall, "cpu_s": cpu, "samples_per_s": args.iters * args.batch_size / wall,
                                "last_loss": losses[-1]})
            print(f"repeat {r + 1}/{args.repeats} {name}: {times[name][-1]['samples_per_s']:.1f} samples/s "
                  f"({1000 * wall / args.iters:.0f} ms/step, CPU {1000 * cpu / args.iters:.0f} ms/step)", flush=True)
    for name in benches:
        sps = [t["samples_per_s"] for t in times[name]]
        cpu_ms = [1000 * t["cpu_s"] / args.iters for t in times[name]]
        res["variants"][name] = {"samples_per_s": statistics.median(sps), "samples_per_s_all": sps,
                                 "cpu_ms_per_step": statistics.median(cpu_ms),
                                 "ms_per_step": 1000 * args.batch_size / statistics.median(sps),
                                 "last_loss": times[name][-1]["last_loss"]}
    if args.sync_debug and device.type == "cuda":
        for name, bench in benches.items():
            print(f"\n## host syncs: {name} (one step)\n" + "\n".join(host_syncs(bench, device)), flush=True)
    elif args.sync_debug:
        print("--sync-debug: CUDA only (a CPU step never waits for a device); skipped", flush=True)
    if args.profile:
        for name, bench in benches.items():
            table = profile(bench, args.profile, device, 30)
            print(f"\n## profile: {name} ({args.profile} steps)\n{table}", flush=True)
    del benches
    if not args.no_memory:
        for name in res["variants"]:
            res["variants"][name].update(measure_memory(name, args))
    res["loadavg_end"] = os.getloadavg()
    res["peak_rss_main_mib"] = peak_rss_bytes() / 2**20
    ref = res["variants"].get("reference")
    print(f"\n{args.batch_size} x {args.regions} x {args.feature_dim} regions, BiGRU text, {device} "
          f"({info['cpu'] if device.type == 'cpu' else info.get('gpu')}), {res['threads']} threads, "
          f"amp {res['amp']}; median of {args.repeats} x {args.iters} steps; load average "
          f"{res['loadavg_start'][0]:.1f} -> {res['loadavg_end'][0]:.1f}\n")
    cuda = device.type == "cuda"
    print("| step | samples/s (median) | range | ms/step | CPU ms/step | vs reference | peak RSS MiB |"
          + (" CUDA peak MiB |" if cuda else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if cuda else ""))
    for name, v in res["variants"].items():
        ratio = v["samples_per_s"] / ref["samples_per_s"] if ref else float("nan")
        v["ratio_to_reference"] = ratio
        mem = f"{v['peak_rss_mib']:.0f}" if "peak_rss_mib" in v else "-"
        print(f"| {name} | {v['samples_per_s']:.1f} | {min(v['samples_per_s_all']):.1f}-"
              f"{max(v['samples_per_s_all']):.1f} | {v['ms_per_step']:.0f} | {v['cpu_ms_per_step']:.0f} | "
              f"{ratio:.2f}x | {mem} |" + (f" {v.get('cuda_peak_over_inputs_mib', math.nan):.0f} |" if cuda else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
