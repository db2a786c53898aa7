"""Data sets: scikit-learn's bundled ones (built in) and IDX image files (MNIST, Fashion-MNIST).

Nothing is downloaded at run time.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def breast_cancer(intercept: bool = True):
    """scikit-learn's breast-cancer data (569 x 30, labels 0 = malignant, 1 = benign).

    Features are standardised to zero mean and unit variance; with ``intercept`` a column of
    ones is appended (so d = 31).
    """
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    if intercept:
        X = np.hstack([X, np.ones((X.shape[0], 1))])
    return X, y.astype(float)


# -- image data for the network of Section V --------------------------------------------------------

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


class DatasetNotFound(FileNotFoundError):
    """The data files are not where they were looked for; the message says how to get them."""


def read_idx(path) -> np.ndarray:
    """Read an IDX file (the MNIST / Fashion-MNIST format), gzip-compressed or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} but the file holds {data.size} values")
    return data.reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz",
                 stem.replace("-idx", ".idx")):
        if (directory / name).exists():
            return directory / name
    raise DatasetNotFound(stem)


def load_idx_dataset(directory, split: str = "train", name: str = "the data set"):
    """Images scaled to [0, 1] as rows (n, 784) and integer labels (n,) from an IDX directory."""
    directory = Path(directory)
    img, lab = _FILES[split]
    try:
        X = read_idx(_find(directory, img))
        y = read_idx(_find(directory, lab))
    except DatasetNotFound as exc:
        raise DatasetNotFound(
            f"{name}: no file {exc.args[0]}[.gz] in {directory}. For Fashion-MNIST install the "
            "Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), which "
            f"puts the four IDX files in {FASHION_MNIST_DIR}; for MNIST get its four IDX files "
            "yourself and pass their folder as data_dir (--data-dir on the command line).") \
            from None
    X = X.reshape(X.shape[0], -1).astype(float) / 255.0
    return X, y.astype(np.int64)


def fashion_mnist(data_dir=None):
    """Fashion-MNIST ((60000, 784), (10000, 784) rows in [0, 1], labels 0..9).

    Read from ``data_dir`` or the Debian package's folder /usr/share/datasets/fashion-mnist.
    """
    d = Path(data_dir) if data_dir else FASHION_MNIST_DIR
    return (load_idx_dataset(d, "train", "Fashion-MNIST"),
            load_idx_dataset(d, "test", "Fashion-MNIST"))


def mnist(data_dir):
    """MNIST from the four IDX files a user provides in ``data_dir`` (no download)."""
    if not data_dir:
        raise DatasetNotFound("MNIST is read from files you provide (nothing is downloaded): "
                              "pass the folder with its four IDX files "
                              "(train-images-idx3-ubyte[.gz], ...) as data_dir (--data-dir on "
                              "the command line)")
    return (load_idx_dataset(data_dir, "train", "MNIST"),
            load_idx_dataset(data_dir, "test", "MNIST"))


def digits(test_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's digits (1797 images of 8x8, 10 classes), scaled to [0, 1], split into
    train and test parts: ((X_train, y_train), (X_test, y_test)). The built-in small default."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    perm = np.random.default_rng(seed).permutation(len(y))
    cut = int(round(len(y) * (1 - test_fraction)))
    tr, te = perm[:cut], perm[cut:]
    return (X[tr], y[tr].astype(np.int64)), (X[te], y[te].astype(np.int64))


def image_dataset(name: str = "digits", data_dir=None):
    """"digits" (built in), "fashion-mnist" (Debian package or data_dir) or "mnist" (data_dir)."""
    if name == "digits":
        return digits()
    if name == "fashion-mnist":
        return fashion_mnist(data_dir)
    if name == "mnist":
        return mnist(data_dir)
    raise ValueError(f"unknown data set {name!r}: use 'digits', 'fashion-mnist' or 'mnist'")
