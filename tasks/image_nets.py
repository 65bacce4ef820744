"""The image task's networks: ``Sequential(ImageInput, Augment, core)``.

``ImageInput`` normalises the decoded pixels (0..255, ``[n, c, h, w]``) with the train split's
per-channel mean and std, so the exported program takes pixels. ``Augment`` mirrors and shifts
images in training only; its draws come from torch's CPU generator, whose state every checkpoint
holds, so a resumed run draws what the uninterrupted one would have.

``model.kind``: ``image_cnn`` (two conv blocks per width in ``model.channels``), ``resnet18`` or
``resnet50`` (torchvision's parameter names, so ``model.weights`` may be a torchvision or timm state
dict, in a ``.safetensors`` file or a torch one).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from core.config import ModelConfig
from tasks.image_options import ImagesConfig

log = logging.getLogger(__name__)


class ImageInput(nn.Module):
    def __init__(self, mean: list[float], std: list[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1))
        self.register_buffer("scale", 1.0 / torch.tensor(std, dtype=torch.float32).clamp_min(1e-3).reshape(1, -1, 1, 1))

    def forward(self, x):
        x = (x.float() / 255.0 - self.mean) * self.scale
        return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x


class Augment(nn.Module):
    def __init__(self, hflip: bool, shift: int):
        super().__init__()
        self.hflip, self.shift = hflip, shift

    def forward(self, x):
        if not self.training or not (self.hflip or self.shift):
            return x
        n = x.shape[0]
        if self.hflip:
            flip = (torch.rand(n) < 0.5).to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if self.shift:
            s = self.shift
            h, w = x.shape[-2:]
            padded = nn.functional.pad(x, (s, s, s, s))
            dy, dx = torch.randint(0, 2 * s + 1, (2, n))
            rows = (torch.arange(h)[None, :] + dy[:, None]).to(x.device)  # [n, h]
            cols = (torch.arange(w)[None, :] + dx[:, None]).to(x.device)  # [n, w]
            idx = torch.arange(n, device=x.device)[:, None, None]
            x = padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        return x


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


def image_cnn(channels: int, n_classes: int, widths: tuple[int, ...], hidden: int, dropout: float) -> nn.Sequential:
    layers, c = [], channels
    for i, width in enumerate(widths):
        layers += [_block(c, width), _block(width, width)]
        if i < len(widths) - 1:
            layers.append(nn.MaxPool2d(2))
        c = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c, hidden), nn.ReLU(inplace=True),
               nn.Linear(hidden, n_classes)]
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block: 1x1 down to ``width``, 3x3 (the stride), 1x1 up to ``4 x width``."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet (v1.5: the stride on the 3x3), parameter for parameter, so its state dicts
    (and timm's ``resnet18``/``resnet50``, which use the same names) load. Any input size of 8 px or
    more gives one logit per class: the stem and four stages divide it by 32, and the pooling is
    adaptive, so 8x8 digits end at 1x1 as 224 px photos end at 7x7."""

    def __init__(self, block: type, depths: tuple[int, ...], channels: int, n_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c = 64
        for i, (width, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
            stride = 1 if i == 1 else 2
            blocks = [block(c, width, stride)]
            c = width * block.expansion
            blocks += [block(c, width, 1) for _ in range(depth - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def ResNet18(channels: int, n_classes: int) -> ResNet:  # noqa: N802 - named like the network it builds
    return ResNet(BasicBlock, (2, 2, 2, 2), channels, n_classes)


def ResNet50(channels: int, n_classes: int) -> ResNet:  # noqa: N802
    return ResNet(Bottleneck, (3, 4, 6, 3), channels, n_classes)


RESNETS = {"resnet18": ResNet18, "resnet50": ResNet50}


def head_names(core: nn.Module) -> tuple[str, ...]:
    """The parameter names (in ``core``) of the classifier head, the part fine-tuning trains from the
    start: a ResNet's ``fc``; image_cnn's layers after its pooling (its two Linear layers)."""
    if isinstance(core, ResNet):
        return tuple(f"fc.{n}" for n, _ in core.fc.named_parameters())
    if isinstance(core, nn.Sequential):
        pools = [i for i, m in enumerate(core) if isinstance(m, nn.AdaptiveAvgPool2d)]
        if pools:
            return tuple(n for n, _ in core.named_parameters() if int(n.split(".", 1)[0]) > pools[-1])
    return ()


def _read_state(path: Path) -> dict:
    """A ``.safetensors`` file through safetensors (no pickle at all); anything else through
    ``torch.load(weights_only=True)``. ValueError naming the file when it is not a state dict."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch and safetensors raise many kinds; all mean "not a state dict"
        raise ValueError(f"model.weights: {path} is not a loadable state dict: {type(exc).__name__}: {exc}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"model.weights: {path} holds a {type(state).__name__}, not a state dict")
    return state


def _names(keys: list[str], most: int = 5) -> str:
    return ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "")


def load_weights(core: nn.Module, path: Path) -> list[str]:
    """Initial weights from a local state-dict file (``.safetensors``, or a torch file read with
    ``weights_only``: nothing else is unpickled), names matched strictly: a key the model lacks or a
    key of the model the file lacks is a ValueError naming them (a ``module.`` prefix, as DDP saves,
    is dropped). Two shape differences are taken: the classifier head of another size (a 1000-class
    ImageNet ``fc``) stays as initialised, for this data's classes; a colour first convolution for a grey
    model is summed over its input channels. Returns the keys left as initialised."""
    state = {k.removeprefix("module."): v for k, v in _read_state(path).items()}
    own = core.state_dict()
    unexpected = sorted(k for k in state if k not in own)
    # A batch-norm step counter is bookkeeping, not a weight: files saved without it (timm's) load.
    missing = sorted(k for k in own if k not in state and not k.endswith(".num_batches_tracked"))
    if unexpected and len(unexpected) == len(state):
        raise ValueError(f"model.weights: {path}: none of its {len(state)} keys fit the model "
                         f"(e.g. {list(state)[:3]}; the model's: {list(own)[:3]})")
    if unexpected or missing:
        raise ValueError(f"model.weights: {path} does not fit model.kind's names: missing {_names(missing) or 'none'}; "
                         f"unexpected {_names(unexpected) or 'none'}")
    heads, taken, replaced, wrong = set(head_names(core)), {}, [], []
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            wrong.append(f"{key} (a {type(value).__name__})")
            continue
        if value.shape != own[key].shape and value.ndim == 4 and own[key].shape[1] == 1 and value.shape[1] == 3:
            value = value.sum(1, keepdim=True)
        if value.shape == own[key].shape:
            taken[key] = value
        elif key in heads:
            replaced.append(key)
        else:
            wrong.append(f"{key} {tuple(value.shape)} for {tuple(own[key].shape)}")
    if wrong:
        raise ValueError(f"model.weights: {path}: tensors of another shape than the model's: {_names(wrong)}")
    core.load_state_dict(taken, strict=False)
    if replaced:
        log.info("model.weights: %s: the head (%s) is for another class count; replaced by a fresh one for "
                 "this data's %d classes", path.name, ", ".join(replaced), _out_features(core))
    return replaced


def _out_features(core: nn.Module) -> int:
    last = [m for m in core.modules() if isinstance(m, nn.Linear)]
    return last[-1].out_features if last else 0


def channels_last(model: nn.Module) -> nn.Module:
    """Every 4-d parameter and buffer (the convolutions' weights) in channels_last memory order, as
    ``ImageInput`` gives the pixels on CUDA: cuDNN then runs each convolution without a layout copy."""
    return model.to(memory_format=torch.channels_last)


def image_network(model: ModelConfig, images: ImagesConfig, n_classes: int, mean: list[float], std: list[float],
                  root: Path) -> nn.Sequential:
    """``Sequential(ImageInput, Augment, core)``: ``core`` from ``model.factory(channels, n_classes,
    **model.kwargs)``, or ``model.kind``'s network with ``model.weights`` loaded (a factory loads its own)."""
    if model.factory is not None:
        from tasks.factory import factory_module

        core = factory_module(model.factory, images.channels, n_classes, **model.kwargs)
    elif model.kind in RESNETS:
        core = RESNETS[model.kind](images.channels, n_classes)
    else:
        core = image_cnn(images.channels, n_classes, tuple(model.channels), model.hidden, model.dropout)
    if model.weights is not None and model.factory is None:
        load_weights(core, Path(root) / model.weights)
    return nn.Sequential(ImageInput(mean, std), Augment(images.augment.hflip, images.augment.shift), core)
