"""Built-in data: scikit-learn's bundled data sets (no download at run time)."""

from __future__ import annotations

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
