"""Real-resolution image networks: resnet18 / resnet50 with torchvision's names, pretrained weights
from safetensors, and the fine-tuning recipes (backbone LR scale, frozen backbone) the engine honours."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from core.config import config_from_dict
from tasks.image_nets import ResNet18, ResNet50, head_names, image_cnn, image_network, load_weights


def _save(state: dict, path) -> None:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))


def test_resnet50_has_torchvisions_names_and_parameter_count():
    net = ResNet50(3, 1000)
    keys = set(net.state_dict())
    assert {"conv1.weight", "bn1.num_batches_tracked", "layer1.0.conv3.weight", "layer1.0.bn3.running_var",
            "layer1.0.downsample.0.weight", "layer1.0.downsample.1.bias", "layer3.5.conv2.weight",
            "layer4.2.bn3.weight", "fc.weight", "fc.bias"} <= keys
    assert "layer1.1.downsample.0.weight" not in keys and "layer3.6.conv1.weight" not in keys
    assert sum(p.numel() for p in net.parameters()) == 25_557_032  # torchvision's resnet50
    assert net.fc.in_features == 2048 and head_names(net) == ("fc.weight", "fc.bias")


@pytest.mark.parametrize("build,size", [(ResNet18, 8), (ResNet50, 8), (ResNet18, 224)])
def test_resnets_take_digits_and_photos(build, size):
    assert build(1 if size == 8 else 3, 4).eval()(torch.rand(2, 1 if size == 8 else 3, size, size)).shape == (2, 4)


def test_a_torchvision_named_safetensors_file_loads_into_a_fresh_model(tmp_path):
    torch.manual_seed(0)
    src = ResNet18(3, 10)
    for m in src.modules():  # running statistics that differ from a fresh model's
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1), m.running_var.uniform_(0.5, 1.5)
    _save(src.state_dict(), tmp_path / "r18.safetensors")
    torch.manual_seed(1)
    fresh = ResNet18(3, 10)
    x = torch.rand(2, 3, 32, 32)
    assert not torch.allclose(fresh.eval()(x), src.eval()(x))
    assert load_weights(fresh, tmp_path / "r18.safetensors") == []
    assert torch.equal(fresh.eval()(x), src.eval()(x))
    _save({k: v for k, v in src.state_dict().items() if not k.endswith("num_batches_tracked")},
          tmp_path / "timm.safetensors")  # as timm's files come
    assert load_weights(ResNet18(3, 10), tmp_path / "timm.safetensors") == []


def test_an_imagenet_head_is_replaced_for_the_datas_classes(tmp_path, caplog):
    torch.manual_seed(0)
    src = ResNet50(3, 1000).state_dict()
    _save(src, tmp_path / "r50.safetensors")
    net = ResNet50(3, 5)
    head = net.fc.weight.detach().clone()
    with caplog.at_level("INFO", logger="tasks.image_nets"):
        replaced = load_weights(net, tmp_path / "r50.safetensors")
    assert sorted(replaced) == ["fc.bias", "fc.weight"]
    assert torch.equal(net.fc.weight, head) and torch.equal(net.layer4[2].conv3.weight, src["layer4.2.conv3.weight"])
    assert "replaced by a fresh one for this data's 5 classes" in caplog.text


def test_a_file_with_other_names_or_shapes_is_refused_naming_the_keys(tmp_path):
    state = ResNet18(3, 10).state_dict()
    _save({**{k: v for k, v in state.items() if k != "layer2.0.bn1.bias"}, "layer9.0.weight": torch.zeros(1)},
          tmp_path / "renamed.safetensors")
    with pytest.raises(ValueError, match=r"model\.weights: .*renamed\.safetensors.*missing layer2\.0\.bn1\.bias; "
                                         r"unexpected layer9\.0\.weight$"):
        load_weights(ResNet18(3, 10), tmp_path / "renamed.safetensors")
    _save({**state, "layer1.0.conv1.weight": torch.zeros(64, 64, 1, 1)}, tmp_path / "shape.safetensors")
    with pytest.raises(ValueError,
                       match=r"another shape .*layer1\.0\.conv1\.weight \(64, 64, 1, 1\) for \(64, 64, 3, 3\)"):
        load_weights(ResNet18(3, 10), tmp_path / "shape.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=r"model\.weights: .*junk\.safetensors is not a loadable state dict"):
        load_weights(ResNet18(3, 10), tmp_path / "junk.safetensors")
    _save(ResNet50(3, 10).state_dict(), tmp_path / "r50.safetensors")  # another kind's file
    with pytest.raises(ValueError, match=r"missing none; unexpected layer1\.0\.bn3\.bias, "):
        load_weights(ResNet18(3, 10), tmp_path / "r50.safetensors")


def _images_cfg(**model):
    return config_from_dict({"name": "img", "task": "image_classification",
                             "dataset": {"path": "data/x", "images": {"classes": ["a", "b", "c"], "size": [32, 32]}},
                             "model": model})


def test_image_task_declares_the_backbone_group_only_when_asked():
    from tasks.images import ImageClassification

    task = ImageClassification()
    cfg = _images_cfg(kind="resnet18")
    net = image_network(cfg.model, cfg.dataset.images, 3, [0.5], [0.2], None)
    assert task.param_groups(cfg, net) == ()
    cfg = _images_cfg(kind="resnet18", backbone_lr_scale=0.1, freeze_backbone_epochs=2)
    (group,) = task.param_groups(cfg, net)
    assert (group.lr_scale, group.frozen_epochs) == (0.1, 2)
    assert "2.conv1.weight" in group.names and "2.layer4.1.bn2.bias" in group.names
    assert {n for n, _ in net.named_parameters()} - group.names == {"2.fc.weight", "2.fc.bias"}
    cnn = image_cnn(1, 3, (8, 16), 32, 0.1)
    assert head_names(cnn) == ("8.weight", "8.bias", "10.weight", "10.bias")


def test_new_model_keys_at_their_defaults_keep_the_config_id():
    base = _images_cfg(kind="resnet18")
    assert _images_cfg(kind="resnet18", backbone_lr_scale=1.0, freeze_backbone_epochs=0).config_id() == base.config_id()
    assert _images_cfg(kind="resnet18", backbone_lr_scale=0.1).config_id() != base.config_id()
    assert _images_cfg(kind="resnet18", freeze_backbone_epochs=1).config_id() != base.config_id()


def test_channels_last_is_set_on_cuda_only():
    from tasks.image_nets import channels_last
    from tasks.images import ImageClassification

    cfg = _images_cfg(kind="resnet18")
    net = image_network(cfg.model, cfg.dataset.images, 3, [0.5], [0.2], None)
    placed = ImageClassification().to_device(cfg, net, torch.device("cpu"))  # the CPU path: as built
    assert placed[2].conv1.weight.is_contiguous()
    assert not placed[2].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    channels_last(net)
    assert net[2].layer1[0].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.rand(2, 3, 32, 32) * 255
    assert net.eval()(x).shape == (2, 3)
