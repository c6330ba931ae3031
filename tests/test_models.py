import pytest
import torch

from hetfl.common.models import CNN, build_model, count_parameters, get_state, resnet18, resnet34, set_state, vgg16


@pytest.mark.parametrize(
    "name,shape,classes",
    [("cnn", (1, 28, 28), 10), ("cnn", (1, 8, 8), 10), ("resnet8", (3, 32, 32), 10), ("resnet18", (3, 32, 32), 100),
     ("resnet34", (3, 32, 32), 10), ("vgg16", (3, 32, 32), 10), ("mobilenetv2", (3, 32, 32), 10),
     ("resnet18", (1, 28, 28), 10)],
)
def test_forward_shapes(name, shape, classes):
    m = build_model(name, classes, shape).eval()
    with torch.no_grad():
        out = m(torch.randn(2, *shape))
    assert out.shape == (2, classes)


def test_parameter_counts_match_the_literature():
    # FedAvg CNN (McMahan et al.) with hidden layers 512 and 128
    assert count_parameters(CNN(10, 1, 28)) == (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (3136 * 512 + 512) + (512 * 128 + 128) + (128 * 10 + 10)
    assert count_parameters(resnet18(10)) == 11_173_962  # torchvision-style CIFAR ResNet-18
    assert abs(count_parameters(resnet34(100)) - 21_328_292) < 1000
    assert abs(count_parameters(vgg16(10)) / 1e6 - 33.65) < 0.01  # AdaptiveFL Table 1, L1


def test_width_multiplier_shrinks_hidden_layers_only():
    full, half = build_model("vgg16", 10, (3, 32, 32)), build_model("vgg16", 10, (3, 32, 32), width=0.5)
    assert count_parameters(half) < 0.3 * count_parameters(full)
    assert half.features[0].in_channels == 3 and half.classifier[-1].out_features == 10
    assert half.features[0].out_channels == 32


def test_state_roundtrip_and_checks():
    a, b = build_model("resnet8", 10, (3, 32, 32)), build_model("resnet8", 10, (3, 32, 32))
    state = get_state(a)
    set_state(b, state)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    bad = dict(state)
    bad["fc.weight"] = bad["fc.weight"][:5]
    with pytest.raises(ValueError, match="fc.weight"):
        set_state(b, bad)
    with pytest.raises(KeyError, match="missing"):
        set_state(b, {k: v for k, v in state.items() if k != "fc.bias"})
