"""Write scikit-learn's 8x8 digits as a dataset directory of your own (docs/bring-your-own.md).

    python examples/byo/make_digits.py /tmp/byo-digits

The directory is what ``DatasetDict.save_to_disk`` writes: splits ``train`` and ``test``, an ``image`` column of
8x8 grayscale PIL images and a ``label`` column of class ids (a ClassLabel, so the number of classes is known).
Any dataset with an image (or text) column and an integer label column works the same way.
"""

import sys

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
from PIL import Image as PILImage
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main(out: str) -> None:
    d = load_digits()
    pixels = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # 0..16 -> 0..255
    xtr, xte, ytr, yte = train_test_split(pixels, d.target, test_size=0.2, random_state=0, stratify=d.target)
    features = Features({"image": Image(), "label": ClassLabel(names=[str(k) for k in range(10)])})

    def split(x, y):
        return Dataset.from_dict({"image": [PILImage.fromarray(i, mode="L") for i in x], "label": y.tolist()},
                                 features=features)

    DatasetDict({"train": split(xtr, ytr), "test": split(xte, yte)}).save_to_disk(out)
    print(f"wrote {len(ytr)} train and {len(yte)} test images to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/byo-digits")
