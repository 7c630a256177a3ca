"""RRF-Net (Liu, Guo, Bakker, Lew, ICCV 2017; Y. Liu's thesis ch. 5): recurrent residual fusion + bi-rank loss.

Two unshared branches over one vector per image (mean-pooled CNN grid) and one per caption (HGLMM Fisher
vector, or any text encoder's mean-pooled output)::

    [BN_in] -> FC1 -> ReLU -> Dropout -> FC2 -> BN -> ReLU -> RRF(FC3, T steps) -> fusion -> [BN -> ReLU]
            -> FC4 -> BN -> L2

RRF: x_{t+1} = x_t + ReLU(BN_t(W x_t + b)) for t = 0..T (W, b shared; BN_t per step); the fusion mixes the
T+1 step outputs with T+1 learned weights and a bias (``conv``), sums them (``sum``) or keeps the last
(``none``). ``rrf: false`` is the thesis' 4-layer baseline (FC3 -> BN -> ReLU, no residual, no fusion).
Items in [ ] are in the released Caffe model but not in the thesis text (``input_bn``, ``fusion_bn``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xmr.config.loader import method_schema
from xmr.losses.bi_rank import bi_rank_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.pooling import mean_pool

FUSIONS = ("conv", "sum", "none")


class RecurrentResidualFusion(nn.Module):
    """FC3 applied ``steps + 1`` times with shared weights, one BatchNorm per application, then fusion.

    ``forward`` returns the fused (B, D) vector; ``step_outputs`` the T+1 side outputs h(x_0) .. h(x_T).
    """

    def __init__(self, dim: int, steps: int, fusion: str = "conv", fusion_bn: bool = True) -> None:
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}")
        self.steps, self.fusion = steps, fusion
        self.fc = nn.Linear(dim, dim)  # shared over the steps
        self.norms = nn.ModuleList(nn.BatchNorm1d(dim) for _ in range(steps + 1))  # not shared
        if fusion == "conv":  # 1x1x(T+1) convolution: T+1 weights + 1 bias shared over the D positions
            self.fusion_weight = nn.Parameter(torch.full((steps + 1,), 1.0 / (steps + 1)))  # averaging; RRFBranch re-initialises
            self.fusion_bias = nn.Parameter(torch.zeros(1))
        # [C]: BN over the (B, 1, D, 1) blob, i.e. ONE mean/variance/gamma/beta over all B*D values
        self.fusion_norm = nn.BatchNorm2d(1) if fusion_bn and fusion != "none" else None

    def step_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for norm in self.norms:
            x = x + F.relu(norm(self.fc(x)))
            outs.append(x)
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = self.step_outputs(x)
        if self.fusion == "none":
            return outs[-1]
        stacked = torch.stack(outs, dim=-1)  # (B, D, T+1)
        z = stacked @ self.fusion_weight + self.fusion_bias if self.fusion == "conv" else stacked.sum(-1)
        if self.fusion_norm is not None:
            z = F.relu(self.fusion_norm(z[:, None, :, None]))[:, 0, :, 0]
        return z


class RRFBranch(nn.Module):
    """One modality's branch: vector in, L2-normalised ``embed_dim`` vector out."""

    def __init__(self, in_dim: int, m: "RRFNetModel") -> None:
        super().__init__()
        hid, emb = m.hidden_dim, m.embed_dim
        self.input_norm = nn.BatchNorm1d(in_dim) if m.input_bn else nn.Identity()
        self.fc1, self.drop = nn.Linear(in_dim, hid), nn.Dropout(m.dropout)
        self.fc2, self.bn2 = nn.Linear(hid, emb), nn.BatchNorm1d(emb)
        if m.rrf:
            self.fc3 = RecurrentResidualFusion(emb, m.steps, m.fusion, m.fusion_bn)
        else:  # baseline: FC3 -> BN -> ReLU
            self.fc3 = nn.Sequential(nn.Linear(emb, emb), nn.BatchNorm1d(emb), nn.ReLU())
        self.fc4, self.bn4 = nn.Linear(emb, emb), nn.BatchNorm1d(emb)
        for mod in self.modules():  # [C]: gaussian(std 0.05) weights, zero biases
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, 0.0, m.init_std)
                nn.init.zeros_(mod.bias)
            elif isinstance(mod, RecurrentResidualFusion) and mod.fusion == "conv":
                nn.init.normal_(mod.fusion_weight, 0.0, m.init_std)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        x = self.drop(F.relu(self.fc1(self.input_norm(v))))
        x = F.relu(self.bn2(self.fc2(x)))
        z = self.bn4(self.fc4(self.fc3(x)))
        return z / (z.norm(dim=-1, keepdim=True) + 1e-6)  # Caffe "Norm" layer


@dataclass(frozen=True)
class RRFNetModel:
    """The ``model`` section (:attr:`RRFNet.schema`)."""
    embed_dim: int
    hidden_dim: int
    rrf: bool
    steps: int
    fusion: str
    input_bn: bool
    fusion_bn: bool
    dropout: float
    init_std: float
    bias_lr_mult: float
    bias_weight_decay: bool


@dataclass(frozen=True)
class RRFNetLoss:
    """The ``loss`` section (:attr:`RRFNet.schema`)."""
    margin: float
    n_neg: int
    weights: list
    negatives: str


@METHODS.register("rrf")
class RRFNet(RetrievalModel):
    model_settings_class, loss_settings_class = RRFNetModel, RRFNetLoss
    gathered_loss = True  # the loss reads only (img, txt, positives): DDP may gather the global batch
    schema = method_schema("rrf")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        self.text = self.build_text_encoder()
        self.image_branch = RRFBranch(image_dim, m)
        self.text_branch = RRFBranch(self.text.out_dim, m)

    def encode_image(self, feats, num_regions):
        return self.image_branch(mean_pool(feats, num_regions))  # grid -> one 2048-d vector (global average)

    def encode_text(self, batch):
        h, lengths = self.text(batch)
        return self.text_branch(mean_pool(h, lengths))

    def compute_loss(self, out, positives, epoch):
        c = self.loss_settings
        return bi_rank_loss(out["img"], out["txt"], positives, c.margin, c.n_neg, tuple(c.weights), c.negatives)

    def param_groups(self, lr, backbone_scale):
        """Caffe multipliers [C]: biases and BN betas get ``bias_lr_mult`` x lr and (by default) no decay."""
        m = self.model_settings
        groups = []
        for g in super().param_groups(lr, backbone_scale):
            ids = {id(p) for p in g["params"]}
            bias = [p for n, p in self.named_parameters() if id(p) in ids and _is_bias(n)]
            bias_ids = {id(p) for p in bias}
            groups.append({**g, "params": [p for p in g["params"] if id(p) not in bias_ids]})
            if bias:
                extra = {} if m.bias_weight_decay else {"weight_decay": 0.0}
                groups.append({"params": bias, "lr": g["lr"] * m.bias_lr_mult, "name": f"{g['name']}_bias",
                               **extra})
        return [g for g in groups if g["params"]]


def _is_bias(name: str) -> bool:
    return name.endswith(".bias") or name.endswith("fusion_bias")
