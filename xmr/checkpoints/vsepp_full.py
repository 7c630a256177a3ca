"""The full-image variant of ``--format vsepp``: fartashf/vsepp models trained on image files with a fine-tuned CNN
(``--data_name coco|f30k``, ``--cnn_type resnet152|vgg19 --finetune``; runs.tar's ``*_resnet_*finetune`` and
``*_vggfull_*finetune``). ``xmr/checkpoints/vsepp.py`` reads the container and the text side and hands the
image CNN's keys (``cnn.*``) here; the variant is decided by those keys (and checked against ``opt.cnn_type``).

The reference's ``EncoderImageFull`` (model.py): ``l2norm(fc(l2norm(cnn(images))))``, the CNN's classifier removed
(ResNet: ``fc`` replaced by an empty Sequential, so the avgpool output; VGG: the classifier without its last
layer, so fc7 after its ReLU). Its DataParallel wrapper sits *inside* the key: ``cnn.module.*`` (ResNet, the
whole net wrapped) and ``cnn.features.module.*`` (VGG, only the convolutions wrapped). VGG files written before
pytorch/vision@989d52a name the classifier's linear layers ``cnn.classifier.1/4``; the reference's
``load_state_dict`` renames them to ``0/3`` and so does this reader. Files from torch < 0.4.1 have no BatchNorm
``num_batches_tracked`` counters: they are added as 0 (a training-only counter, unused at evaluation).

xmr runs the same network as its end-to-end image backbone (``features.source: images``) with the reference's
test transform (torchvision ``Resize(256)`` + ``CenterCrop(224)``, ImageNet normalisation: the
``*_224_torchvision`` entries of config/backbones.yaml) and ``model.image_encoder: full_image``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from xmr.checkpoints.base import check_state_keys
from xmr.checkpoints.common import resnet_trunk
from xmr.core.errors import XmrError

#: variant -> (the key prefix that identifies it, opt.cnn_type, xmr backbone key)
VARIANTS = {"resnet152": ("cnn.module.", "resnet152", "resnet152_224_torchvision"),
            "vgg19": ("cnn.features.module.", "vgg19", "vgg19_224_torchvision")}
#: VGG classifier names before pytorch/vision@989d52a -> after (the reference's load_state_dict)
OLD_VGG_CLASSIFIER = {"cnn.classifier.1.": "cnn.classifier.0.", "cnn.classifier.4.": "cnn.classifier.3."}
VGG_CLASSIFIER = ("cnn.classifier.0.", "cnn.classifier.3.")


def full_image_variant(cnn: dict[str, torch.Tensor], opt: dict, src: Path) -> str:
    """``resnet152`` or ``vgg19`` from the CNN's keys; an error when they fit neither or contradict ``opt``."""
    found = [v for v, (prefix, _, _) in VARIANTS.items() if any(k.startswith(prefix) for k in cnn)]
    cnn_type = opt.get("cnn_type")
    if len(found) != 1:
        raise XmrError(f"{src}: a VSE++ full-image model whose CNN keys ({', '.join(sorted(cnn)[:3])} ...) are "
                       f"neither a ResNet-152 (cnn.module.*) nor a VGG19 (cnn.features.module.*) "
                       f"(opt.cnn_type={cnn_type}); the released full-image models use one of those two")
    if cnn_type and cnn_type != VARIANTS[found[0]][1]:
        raise XmrError(f"{src}: opt.cnn_type is {cnn_type} but the CNN's keys are a {found[0]}; xmr imports the "
                       f"released resnet152 and vgg19 models")
    return found[0]


def _with_bn_counters(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Adds a 0 ``num_batches_tracked`` beside every BatchNorm's ``running_mean`` that lacks one."""
    out, added = dict(state), 0
    for key in list(state):
        if key.endswith(".running_mean"):
            counter = key[: -len("running_mean")] + "num_batches_tracked"
            if counter not in out:
                out[counter], added = torch.tensor(0, dtype=torch.long), added + 1
    return out, added


def _vgg_state(cnn: dict[str, torch.Tensor], src: Path) -> tuple[dict[str, torch.Tensor], bool]:
    """VGG19's keys in xmr's names (``image_backbone.net.{features,classifier}.*``); True when the old classifier
    names were renamed."""
    old = any(k.startswith(tuple(OLD_VGG_CLASSIFIER)) for k in cnn)
    out, unknown = {}, []
    for key, value in cnn.items():
        for before, after in OLD_VGG_CLASSIFIER.items():
            if old and key.startswith(before):
                key = after + key[len(before):]
        if key.startswith("cnn.features.module."):
            out["image_backbone.net.features." + key[len("cnn.features.module."):]] = value
        elif key.startswith(VGG_CLASSIFIER):
            out["image_backbone.net." + key[len("cnn."):]] = value
        else:
            unknown.append(key)
    if unknown:
        check_state_keys([], [f"img_enc.{k}" for k in unknown], src,
                         "a VGG19 VSE++ model holds cnn.features.module.* and cnn.classifier.{0,3} (or 1,4)")
    return out, old


def read_full_image(cnn: dict[str, torch.Tensor], opt: dict, src: Path) -> tuple[dict, dict, dict]:
    """(xmr state of the image backbone, run-config sections, provenance) of the CNN part of a VSE++ file."""
    variant = full_image_variant(cnn, opt, src)
    backbone = VARIANTS[variant][2]
    provenance: dict = {"variant": f"full image, {variant}"}
    if variant == "resnet152":
        state, backbone = resnet_trunk(cnn, "cnn.module.", src)
    else:
        state, provenance["renamed_old_vgg_classifier"] = _vgg_state(cnn, src)
    state, provenance["added_num_batches_tracked"] = _with_bn_counters(state)
    sections = {"features": {"source": "images", "backbone": backbone},
                "model": {"image_encoder": "full_image", "image_pool": "mean"}}
    return state, sections, provenance
