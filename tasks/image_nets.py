"""The image task's networks: ``Sequential(ImageInput, Augment, core)``.

``ImageInput`` normalises the decoded pixels (0..255, ``[n, c, h, w]``) with the train split's
per-channel mean and std, so the exported program takes pixels. ``Augment`` mirrors and shifts
images in training only; its draws come from torch's CPU generator, whose state every checkpoint
holds, so a resumed run draws what the uninterrupted one would have.

``model.kind``: ``image_cnn`` (two conv blocks per width in ``model.channels``) or ``resnet18``
(torchvision's parameter names, so ``model.weights`` may be a torchvision state dict).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from core.config import ModelConfig
from tasks.image_options import ImagesConfig


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


class ResNet18(nn.Module):
    def __init__(self, channels: int, n_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, c = (64, 128, 256, 512), 64
        for i, width in enumerate(widths, start=1):
            stride = 1 if i == 1 else 2
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(c, width, stride), BasicBlock(width, width, 1)))
            c = width
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def load_weights(core: nn.Module, path: Path) -> list[str]:
    """Initial weights from a local state-dict file (``weights_only``: nothing else is unpickled).
    A tensor of another shape is left as initialised (a head for another class count), except a colour
    first convolution for a grey model, summed over its input channels. Returns the keys left out;
    ValueError for an unreadable file or one that fits none of the model's keys."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds; all mean "not a state dict"
        raise ValueError(f"model.weights: {path} is not a loadable state dict: {type(exc).__name__}: {exc}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"model.weights: {path} holds a {type(state).__name__}, not a state dict")
    own = core.state_dict()
    taken, skipped = {}, []
    for key, value in state.items():
        key = key.removeprefix("module.")
        if key not in own or not isinstance(value, torch.Tensor):
            skipped.append(key)
            continue
        if value.shape != own[key].shape and value.ndim == 4 and own[key].shape[1] == 1 and value.shape[1] == 3:
            value = value.sum(1, keepdim=True)
        if value.shape != own[key].shape:
            skipped.append(key)
            continue
        taken[key] = value
    if not taken:
        raise ValueError(f"model.weights: {path}: none of its {len(state)} keys fit the model "
                         f"(e.g. {list(state)[:3]}; the model's: {list(own)[:3]})")
    core.load_state_dict(taken, strict=False)
    return skipped


def image_network(model: ModelConfig, images: ImagesConfig, n_classes: int, mean: list[float], std: list[float],
                  root: Path) -> nn.Sequential:
    """``Sequential(ImageInput, Augment, core)``: ``core`` from ``model.factory(channels, n_classes,
    **model.kwargs)``, or ``model.kind``'s network with ``model.weights`` loaded (a factory loads its own)."""
    if model.factory is not None:
        from tasks.factory import factory_module

        core = factory_module(model.factory, images.channels, n_classes, **model.kwargs)
    elif model.kind == "resnet18":
        core = ResNet18(images.channels, n_classes)
    else:
        core = image_cnn(images.channels, n_classes, tuple(model.channels), model.hidden, model.dropout)
    if model.weights is not None and model.factory is None:
        load_weights(core, Path(root) / model.weights)
    return nn.Sequential(ImageInput(mean, std), Augment(images.augment.hflip, images.augment.shift), core)
