"""A model of your own for hetfl (docs/bring-your-own.md): run config ``model = "my_model:build"``.

hetfl calls ``build(num_classes, input_shape)``: ``input_shape`` is (C, H, W) for images (batches arrive as
normalised float32 NCHW tensors) and (text-max-length,) for texts (int64 token ids). The module returns logits of
shape (batch, num_classes). hetfl seeds torch before the call, so the initial weights follow the run's seed.
"""

from torch import nn


def build(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """A two-layer perceptron over the flattened image."""
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(), nn.Linear(64, num_classes))
