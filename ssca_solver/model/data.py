"""Federated data: the rows each client holds (paper Section II).

``FederatedData`` is the modelling-layer view: the user declares which rows live where. The
solver hands each client's rows to a client object of :mod:`ssca_solver.federated` and the
server never sees them again.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import DataError

#: ``FederatedData.dirichlet``'s default ``min_rows``: 10, the default ``batch_size`` of
#: fedavg, primal_dual and augmented_lagrangian (a client with fewer rows cannot draw it)
MIN_CLIENT_ROWS = 10

#: ``FederatedData.dirichlet(on_small_client=...)``
ON_SMALL_CLIENT = ("warn", "raise", "redraw")

#: draws of ``FederatedData.dirichlet`` before it gives up giving every client its minimum
DIRICHLET_DRAWS = 1000


class SmallClientWarning(UserWarning):
    """``FederatedData.dirichlet`` made a client with fewer rows than ``min_rows``."""


@dataclass(frozen=True)
class ClientData:
    """The rows of one client: features ``X`` (N_i, ...) and optional targets ``y`` (N_i, ...)."""

    X: np.ndarray
    y: Optional[np.ndarray] = None

    @property
    def num_rows(self) -> int:
        return int(self.X.shape[0])


def _as_client(item, index: int) -> ClientData:
    """One client's ``(X, y)`` as arrays, checked; DataError naming the client otherwise."""
    if isinstance(item, ClientData):
        X, y = item.X, item.y
    elif isinstance(item, np.ndarray):
        X, y = item, None
    elif isinstance(item, (tuple, list)) and len(item) in (1, 2):
        X = item[0]
        y = item[1] if len(item) == 2 else None
    else:
        raise DataError(f"client {index}: expected an array X or a pair (X, y), "
                        f"got {type(item).__name__}")
    X = _as_array(X, "X", f"client {index}")
    if X.ndim == 0:
        raise DataError(f"client {index}: X must have at least one dimension (rows)")
    if X.shape[0] == 0:
        raise DataError(f"client {index} has no rows; every client must hold at least one sample")
    _check_values(X, "X", f"client {index}", allow_bool=False)
    if not np.issubdtype(X.dtype, np.inexact):
        # products of features (X * X in curvatures, X' X) overflow in small integer types
        # (int8: 100 * 100 wraps to 16): integer features are computed in float64
        X = X.astype(np.float64)
    if y is not None:
        y = _as_array(y, "y", f"client {index}")
        if y.ndim == 0 or y.shape[0] != X.shape[0]:
            raise DataError(f"client {index}: X has {X.shape[0]} rows but y has "
                            f"{y.shape[0] if y.ndim else 0}; arrays of one client must have "
                            "the same length")
        _check_values(y, "y", f"client {index}", allow_bool=True)
    return ClientData(X, y)


def _as_array(a, name: str, where: str) -> np.ndarray:
    """``np.asarray(a)`` (no copy of an array), with ragged nested lists as a DataError."""
    try:
        return np.asarray(a)
    except ValueError as exc:
        raise DataError(f"{where}: {name} is not a rectangular array ({exc}); give every row "
                        "the same length") from None


def _check_values(a: np.ndarray, name: str, where: str, allow_bool: bool) -> None:
    """Refuse non-numeric and complex dtypes and non-finite entries, naming the first bad row.

    Vectorised and copy-free for valid data: integer and bool arrays cannot hold a non-finite
    value; a float array is scanned row by row only when its sum is not finite.
    """
    if np.iscomplexobj(a):
        raise DataError(f"{where}: {name} has complex dtype {a.dtype}; the solver works with "
                        f"real data: pass the real part ({name}.real) or put the real and "
                        "imaginary parts in separate columns")
    if a.dtype == np.bool_ and allow_bool:
        return
    if not np.issubdtype(a.dtype, np.number):
        raise DataError(f"{where}: {name} must be numeric (float or int), got dtype {a.dtype}; "
                        f"convert it, e.g. np.asarray({name}, dtype=float), after replacing "
                        "entries that are not numbers")
    if not np.issubdtype(a.dtype, np.inexact):
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum()):  # NaN and +-inf propagate; an overflow falls through
            return
    row_ok = np.isfinite(a).reshape(a.shape[0], -1).all(axis=1)
    if row_ok.all():
        return
    row = int(np.flatnonzero(~row_ok)[0])
    values = np.ravel(a[row])
    bad = values[~np.isfinite(values)][0]
    raise DataError(f"{where}, row {row}: {name} has a non-finite value ({bad}); the solver "
                    "needs finite numbers: drop or impute such rows before building "
                    "FederatedData")


class FederatedData:
    """Samples partitioned over I clients: client i holds N_i rows, sum N_i = N.

    Args:
      clients: a sequence of ``(X_i, y_i)`` pairs (or arrays ``X_i`` when there are no
        targets), one per client, of any sizes >= 1. All clients must agree on the trailing
        shape of X (and of y). Integer features X are converted to float64 (one copy: their
        products overflow in small integer types); y keeps its dtype (labels may index).

    Examples:
      >>> import numpy as np
      >>> data = FederatedData([(np.ones((3, 2)), np.zeros(3)), (np.ones((5, 2)), np.ones(5))])
      >>> data.num_clients, data.num_samples, data.client_sizes
      (2, 8, (3, 5))
    """

    def __init__(self, clients: Sequence):
        if isinstance(clients, (np.ndarray, ClientData)) or not hasattr(clients, "__len__"):
            raise DataError("FederatedData expects a list of clients [(X1, y1), (X2, y2), ...]; "
                            "use FederatedData.split(X, y, num_clients) to partition one array")
        if len(clients) == 0:
            raise DataError("FederatedData needs at least one client")
        self._clients = tuple(_as_client(c, i) for i, c in enumerate(clients))
        first = self._clients[0]
        for i, c in enumerate(self._clients[1:], start=1):
            if c.X.shape[1:] != first.X.shape[1:]:
                raise DataError(f"client {i}: rows of X have shape {c.X.shape[1:]}, client 0's "
                                f"have {first.X.shape[1:]}")
            if (c.y is None) != (first.y is None):
                raise DataError(f"client {i}: either every client has targets y or none has")
            if c.y is not None and c.y.shape[1:] != first.y.shape[1:]:
                raise DataError(f"client {i}: rows of y have shape {c.y.shape[1:]}, client 0's "
                                f"have {first.y.shape[1:]}")

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def split(cls, X, y=None, num_clients: int = 10, seed=None) -> "FederatedData":
        """Shuffle the N rows and split them into ``num_clients`` IID parts of equal size.

        This is the paper's setting (Section VI: N = 60000 split over I = 10 clients). When
        I does not divide N the sizes differ by at most one.
        """
        X, y, n = _check_split_args(X, y, num_clients)
        perm = np.random.default_rng(seed).permutation(n)
        parts = np.array_split(perm, num_clients)
        return cls._from_index_sets(X, y, parts)

    @classmethod
    def dirichlet(cls, X, y, num_clients: int = 10, alpha: float = 0.5, seed=None,
                  labels=None, min_rows: int = MIN_CLIENT_ROWS,
                  on_small_client: str = "warn") -> "FederatedData":
        """Label-skewed non-IID split: class proportions per client drawn from Dir(alpha).

        For each class, the fraction of its rows sent to each client is drawn from a symmetric
        Dirichlet(alpha); small alpha gives clients dominated by few classes, large alpha tends
        to the IID split. Draws are repeated until every client holds at least one row.

        Small alpha on a small data set easily gives a client 1 or 2 rows: too few for a
        mini-batch (``batch_size`` must not exceed any client's rows) and a noisy share of
        the statistics. A client with fewer than ``min_rows`` rows is therefore reported:

        * ``on_small_client="warn"`` (default): a :class:`SmallClientWarning` naming the
          clients and their sizes; the split is returned as drawn (the same split as
          without the check, for the same seed).
        * ``"raise"``: :class:`~ssca_solver.errors.DataError` instead.
        * ``"redraw"``: the draws are repeated until every client holds ``min_rows`` rows
          (at most 1000 draws, then DataError). The split is then a Dirichlet draw
          conditioned on the sizes: somewhat less skewed than Dir(alpha) itself.

        Args:
          labels: the class of each row when ``y`` is not a label vector (e.g. one-hot rows);
            by default ``y`` itself (or its argmax when y is 2-D).
          min_rows: the smallest client size accepted without a report (default 10: the
            default ``batch_size`` of fedavg, primal_dual and augmented_lagrangian; SSCA's
            default batch starts at 32 rows, or N_i when a client holds fewer). 1 turns the
            check off.
          on_small_client: "warn", "raise" or "redraw", as above.

        Examples:
          >>> import numpy as np, warnings
          >>> X, y = np.arange(60.0).reshape(30, 2), np.repeat([0, 1, 2], 10)
          >>> with warnings.catch_warnings(record=True) as caught:
          ...     warnings.simplefilter("always")
          ...     data = FederatedData.dirichlet(X, y, num_clients=3, alpha=0.1, seed=0)
          >>> data.client_sizes, caught[0].category.__name__
          ((10, 2, 18), 'SmallClientWarning')
          >>> FederatedData.dirichlet(X, y, num_clients=3, alpha=0.1, seed=0, min_rows=5,
          ...                         on_small_client="redraw").client_sizes
          (16, 8, 6)
        """
        X, y, n = _check_split_args(X, y, num_clients)
        if not (np.isfinite(alpha) and alpha > 0):
            raise DataError(f"dirichlet: alpha must be > 0, got {alpha!r}")
        if (isinstance(min_rows, (bool, np.bool_)) or not isinstance(min_rows, (int, np.integer))
                or min_rows < 1):
            raise DataError(f"dirichlet: min_rows must be a positive integer, got {min_rows!r}")
        if on_small_client not in ON_SMALL_CLIENT:
            raise DataError(f"dirichlet: on_small_client must be one of {ON_SMALL_CLIENT}, got "
                            f"{on_small_client!r}")
        min_rows = int(min_rows)
        if labels is None:
            if y is None:
                raise DataError("dirichlet: a label-skew split needs labels (y or labels=)")
            yy = np.asarray(y)
            labels = yy.argmax(axis=1) if yy.ndim == 2 else yy
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise DataError(f"dirichlet: labels must have shape ({n},), got {labels.shape}")
        if min_rows * num_clients > n and on_small_client != "warn":
            raise DataError(f"dirichlet: {n} rows cannot give each of {num_clients} clients "
                            f"min_rows={min_rows} rows; use fewer clients or a smaller min_rows")
        need = min_rows if on_small_client == "redraw" else 1
        rng = np.random.default_rng(seed)
        classes = np.unique(labels)
        for _ in range(DIRICHLET_DRAWS):
            parts = [[] for _ in range(num_clients)]
            for k in classes:
                idx = rng.permutation(np.flatnonzero(labels == k))
                p = rng.dirichlet(np.full(num_clients, float(alpha)))
                cuts = (np.cumsum(p)[:-1] * idx.size).astype(int)
                for i, chunk in enumerate(np.split(idx, cuts)):
                    parts[i].extend(chunk.tolist())
            if min(map(len, parts)) >= need:
                break
        else:
            raise DataError(f"dirichlet: could not give every one of {num_clients} clients "
                            f"{need} row{'s' if need > 1 else ''} in {DIRICHLET_DRAWS} draws "
                            f"with alpha={alpha}; use fewer clients or a larger alpha"
                            + (" (or a smaller min_rows)" if need > 1 else ""))
        small = [(i, len(p)) for i, p in enumerate(parts) if len(p) < min_rows]
        if small:
            sizes = ", ".join(f"client {i}: {k}" for i, k in small)
            what = (f"dirichlet (alpha={alpha}, {num_clients} clients, {n} rows) made "
                    f"{len(small)} client{'s' if len(small) > 1 else ''} with fewer than "
                    f"min_rows={min_rows} rows ({sizes})")
            advice = ("a batch_size larger than a client's rows is refused, and a tiny client's "
                      "statistics are noisy. Use fewer clients, a larger alpha or another "
                      "seed; on_small_client='redraw' draws until every client has min_rows, "
                      "min_rows=1 accepts them")
            if on_small_client == "raise":
                raise DataError(f"{what}: {advice}")
            warnings.warn(f"{what}: {advice}", SmallClientWarning, stacklevel=2)
        return cls._from_index_sets(X, y, [np.sort(np.array(p)) for p in parts])

    @classmethod
    def _from_index_sets(cls, X, y, parts) -> "FederatedData":
        """The clients of the index sets ``parts``: one copy of the rows in the clients'
        order, each client a view of its block (shards then hold a shard's rows as one view,
        :mod:`ssca_solver.federated.shards`)."""
        y = None if y is None else np.asarray(y)
        order = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        X = np.asarray(X)[order]
        if X.dtype.kind in "iu":         # as _as_client converts them, once for all clients
            X = X.astype(np.float64)
        y = None if y is None else y[order]
        edges = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).tolist()
        return cls([(X[a:b], None if y is None else y[a:b])
                    for a, b in zip(edges[:-1], edges[1:])])

    # -- views -----------------------------------------------------------------------------------
    @property
    def clients(self) -> tuple[ClientData, ...]:
        return self._clients

    @property
    def num_clients(self) -> int:
        return len(self._clients)

    @property
    def client_sizes(self) -> tuple[int, ...]:
        return tuple(c.num_rows for c in self._clients)

    @property
    def num_samples(self) -> int:
        return sum(self.client_sizes)

    def pooled(self) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """All rows stacked, as a centralised reference solver would see them (tests only)."""
        X = np.concatenate([c.X for c in self._clients])
        y = None if self._clients[0].y is None else np.concatenate([c.y for c in self._clients])
        return X, y

    def __repr__(self) -> str:
        return (f"FederatedData(num_clients={self.num_clients}, num_samples={self.num_samples}, "
                f"client_sizes={self.client_sizes})")


def _check_split_args(X, y, num_clients):
    """(X, y, N) for split/dirichlet, checked; a bad value names its row of the unsplit data."""
    X = _as_array(X, "X", "data to split")
    y = None if y is None else _as_array(y, "y", "data to split")
    n = X.shape[0] if X.ndim else 0
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise DataError(f"num_clients must be a positive integer, got {num_clients!r}")
    if n == 0:
        raise DataError("cannot split an empty data set")
    if num_clients > n:
        raise DataError(f"cannot split {n} rows over {num_clients} clients: a client would "
                        "have no rows")
    if y is not None and y.shape[:1] != (n,):
        raise DataError(f"X has {n} rows but y has {y.shape[:1]}; they must match")
    _check_values(X, "X", "data to split", allow_bool=False)
    if y is not None:
        _check_values(y, "y", "data to split", allow_bool=True)
    return X, y, n
