"""Write scikit-learn's 8x8 digits as a dataset directory of your own (docs/bring-your-own.md).

    python examples/byo/make_digits.py /tmp/byo-digits                  # DatasetDict.save_to_disk
    python examples/byo/make_digits.py /tmp/byo-digits-png --imagefolder  # train/<class>/*.png, test/<class>/*.png

The save_to_disk directory has the splits ``train`` and ``test``, an ``image`` column of 8x8 grayscale PIL images
and a ``label`` column of class ids (a ClassLabel, so the number of classes is known). The image folder has one
subfolder per class under ``train/`` and ``test/``; the `datasets` image-folder reader names the columns ``image``
and ``label`` and the classes after the folders. Any dataset with an image (or text) column and an integer label
column works the same way.
"""

import argparse
from pathlib import Path

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
from PIL import Image as PILImage
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="directory to write")
    p.add_argument("--imagefolder", action="store_true", help="write PNG files in class folders instead")
    a = p.parse_args()
    d = load_digits()
    pixels = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # 0..16 -> 0..255
    xtr, xte, ytr, yte = train_test_split(pixels, d.target, test_size=0.2, random_state=0, stratify=d.target)
    if a.imagefolder:
        for split, xs, ys in (("train", xtr, ytr), ("test", xte, yte)):
            for k, (x, y) in enumerate(zip(xs, ys)):
                folder = Path(a.out) / split / f"digit-{y}"
                folder.mkdir(parents=True, exist_ok=True)
                PILImage.fromarray(x, mode="L").save(folder / f"{k:04d}.png")
    else:
        features = Features({"image": Image(), "label": ClassLabel(names=[str(k) for k in range(10)])})

        def split(x, y):
            return Dataset.from_dict({"image": [PILImage.fromarray(i, mode="L") for i in x], "label": y.tolist()},
                                     features=features)

        DatasetDict({"train": split(xtr, ytr), "test": split(xte, yte)}).save_to_disk(a.out)
    print(f"wrote {len(ytr)} train and {len(yte)} test images to {a.out}")


if __name__ == "__main__":
    main()
