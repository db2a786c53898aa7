"""Secure aggregation: the server learns only the weighted sum of the clients' replies.

The protocol of Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving
Machine Learning", CCS), honest-but-curious server, run as four ordinary request/reply
exchanges through any transport (so it needs nothing from the engine):

1. ``secagg.keys``: each client u makes two X25519 key pairs (c_u for encrypting shares, s_u
   for masks) and a 32-byte self-mask seed b_u, all from the operating system's randomness in
   its own process (the run's seed, which the server knows, plays no part), keeps the secrets
   and sends the two public keys. U1: the clients that answered.
2. ``secagg.shares``: the server sends every public key of U1; each client splits b_u and
   s_u's secret key into Shamir shares (threshold t = floor(n/2) + 1 of the n sampled clients,
   over GF(2^521 - 1)), encrypts the share for v with AES-GCM under HKDF(X25519(c_u, c_v)),
   and sends the ciphertexts. U2: those who answered.
3. The task itself (e.g. ``ssca.round``): the server forwards the ciphertexts (each readable
   only by its recipient) and each client's factor h_u. Client u runs the task, multiplies
   its arrays by its weight a_u = h_u N_u / (B_u N) (so the server needs only the sum),
   encodes them in fixed point, x -> round(x 2^f) modulo 2^64, after checking |a_u x| <=
   ``secure_range`` (an error otherwise, never a clip), and adds
   PRG(b_u) + sum_{v in U2, v > u} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv), where s_uv
   = HKDF(X25519(s_u, s_v)) is known to u and v only and PRG is AES-256 in counter mode.
   U3: those who answered; every entry of a masked reply is uniform on [0, 2^64).
4. ``secagg.unmask``: the server names U3 (survivors) and U2 \\ U3 (dropped); each client
   returns its shares of b_v for every survivor v and of s_v's secret key for every dropped v
   (never both for one client: it checks the two lists are disjoint). With t shares the
   server rebuilds them, removes the survivors' self masks and the dropped clients' pairwise
   masks, and decodes sum_{u in U3} a_u x_u.

What the server learns: the sum over U3 and who is in U1, U2, U3. A dropped client's secret
mask key is rebuilt, which reveals nothing about its input (its masked input never arrived,
or the server ignores it: its self mask b_v stays secret). See docs/privacy.md.

Clients keep the secrets of one aggregation between its four messages (in their own process
on the process transport); a client restarted in between has lost them and counts as dropped.
An engine that hands each message to a fresh client object must carry them on the client's
side between messages: :func:`export_state` / :func:`import_state`.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import replace
from typing import Mapping, Optional, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import RoundFailedError, SecureAggregationError
from .messages import AGGREGATE, SECAGG as ID, Dropout, Reply, Request, own_factor
from .messages import aggregation_weight
from .accounting import DP_NOISE

KEYS, SHARES, UNMASK = "secagg.keys", "secagg.shares", "secagg.unmask"
PRIME = 2 ** 521 - 1                 # a Mersenne prime > 2^256: Shamir shares of 32-byte keys
SHARE_BYTES = 66
_PLAIN = 8 + 2 * SHARE_BYTES          # sender, recipient, share of b, share of s's key
CIPHER_BYTES = 12 + _PLAIN + 16       # nonce, ciphertext, GCM tag
_KEEP = 4                             # aggregations a client keeps secrets for


# -- primitives -----------------------------------------------------------------------------------

def kdf(secret: bytes, info: str) -> bytes:
    """A 32-byte key from a shared secret (HKDF-SHA256)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=info.encode()).derive(secret)


def prg(key: bytes, n: int) -> np.ndarray:
    """n uniform words modulo 2^64: the AES-256-CTR keystream under ``key`` (a fresh key per
    use, so the zero counter block is never reused)."""
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n)) + enc.finalize(), dtype="<u8")


def split_secret(secret: bytes, xs: Sequence[int], threshold: int) -> list[bytes]:
    """Shamir shares of ``secret`` (32 bytes) at the points ``xs`` (distinct, > 0): any
    ``threshold`` of them rebuild it, fewer reveal nothing about it."""
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME)
                                                 for _ in range(threshold - 1)]
    out = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):
            y = (y * x + c) % PRIME
        out.append(y.to_bytes(SHARE_BYTES, "big"))
    return out


def combine_shares(points: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret from ``threshold`` shares (x, share) by Lagrange interpolation at 0."""
    xs = [x for x, _ in points]
    total = 0
    for j, (xj, share) in enumerate(points):
        num = den = 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * (-xm) % PRIME
                den = den * (xj - xm) % PRIME
        total = (total + int.from_bytes(share, "big") * num * pow(den, -1, PRIME)) % PRIME
    if total >= 2 ** 256:
        raise SecureAggregationError("secure aggregation: the shares of a secret do not agree "
                                     "(a corrupted share)")
    return total.to_bytes(32, "big")


def fraction_bits(value_range: float, num_clients: int) -> int:
    """f such that num_clients values of magnitude <= value_range sum below 2^62 in units
    of 2^-f: f = 62 - ceil(log2 range) - ceil(log2 n)."""
    f = 62 - math.ceil(math.log2(value_range)) - math.ceil(math.log2(max(1, num_clients)))
    if f < 8:
        raise SecureAggregationError(
            f"secure_range={value_range:g} with {num_clients} clients leaves {f} fractional "
            "bits of the 64 (fewer than 8): give a smaller secure_range")
    return f


def _public(key) -> np.ndarray:
    return np.frombuffer(key.public_key().public_bytes_raw(), dtype=np.uint8).copy()


def _pk(row) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(np.asarray(row, dtype=np.uint8).tobytes())


def _ids(request: Request, name: str) -> list[int]:
    return [int(i) for i in np.asarray(request.arrays[name]).ravel()]


# -- the client side ------------------------------------------------------------------------------

def _store(client) -> dict:
    store = getattr(client, "_secagg", None)
    if store is None:
        store = client._secagg = {}
    return store


def _state(client, request: Request) -> dict:
    try:
        return _store(client)[request.config[ID]]
    except KeyError:
        raise SecureAggregationError(
            f"client {client.index}: no secrets for aggregation {request.config.get(ID)!r} "
            "(the client was restarted since its keys were made)") from None


def keys_task(client, request: Request) -> Reply:
    """Step 1: new key pairs and self-mask seed, kept here; the public keys go up."""
    store = _store(client)
    while len(store) >= _KEEP:            # aggregations run one after the other
        store.pop(next(iter(store)))
    st = {"c": X25519PrivateKey.generate(), "s": X25519PrivateKey.generate(),
          "b": os.urandom(32)}
    store[request.config[ID]] = st
    return client.reply(request, {"c_pk": _public(st["c"]), "s_pk": _public(st["s"])})


def shares_task(client, request: Request) -> Reply:
    """Step 2: Shamir shares of b_u and of s_u's secret key, each encrypted to its holder."""
    st = _state(client, request)
    ids = _ids(request, "ids")
    c_pk, s_pk = np.asarray(request.arrays["c_pk"]), np.asarray(request.arrays["s_pk"])
    me = client.index
    if me not in ids or not (np.array_equal(c_pk[ids.index(me)], _public(st["c"]))
                             and np.array_equal(s_pk[ids.index(me)], _public(st["s"]))):
        raise SecureAggregationError(f"client {me}: the key list does not hold my keys")
    threshold = int(request.config["threshold"])
    st.update(ids1=ids, c_pk=c_pk.copy(), s_pk=s_pk.copy(), threshold=threshold)
    xs = [i + 1 for i in ids]
    b_sh = split_secret(st["b"], xs, threshold)
    s_sh = split_secret(st["s"].private_bytes_raw(), xs, threshold)
    cipher = np.zeros((len(ids), CIPHER_BYTES), dtype=np.uint8)
    agg = request.config[ID]
    for j, v in enumerate(ids):
        if v == me:
            st["own"] = (b_sh[j], s_sh[j])
            continue
        key = kdf(st["c"].exchange(_pk(c_pk[j])), f"share|{agg}")
        nonce = os.urandom(12)
        plain = me.to_bytes(4, "big") + v.to_bytes(4, "big") + b_sh[j] + s_sh[j]
        ct = nonce + AESGCM(key).encrypt(nonce, plain, agg.encode())
        cipher[j] = np.frombuffer(ct, dtype=np.uint8)
    return client.reply(request, {"cipher": cipher})


class MaskedTask:
    """Step 3 around a task handler: run it, weight, encode and mask its arrays.

    A client built for secure aggregation answers only masked requests of its tasks."""

    def __init__(self, handler):
        self.handler = handler

    def __call__(self, client, request: Request) -> Reply:
        if ID not in request.config:
            raise SecureAggregationError(
                f"client {client.index}: built for secure aggregation, it answers task "
                f"{request.task!r} only as a masked sum")
        st = _state(client, request)
        me, agg = client.index, request.config[ID]
        ids2 = _ids(request, "ids")
        if me not in ids2 or not set(ids2) <= set(st["ids1"]):
            raise SecureAggregationError(f"client {me}: the participant list of the masked "
                                         "step does not fit the key exchange")
        cipher = np.asarray(request.arrays["cipher"])
        col = ids2.index(me)
        st["inbox"] = {v: cipher[j, col].tobytes() for j, v in enumerate(ids2) if v != me}
        st["ids2"] = ids2
        reply = self.handler(client, request)
        a = aggregation_weight(reply, float(request.config["num_samples"]),
                               factor=own_factor(client, request))
        names = sorted(reply.arrays)
        layout = [(k, list(np.shape(reply.arrays[k]))) for k in names]
        vec = np.concatenate([a * np.asarray(reply.arrays[k], dtype=float).ravel()
                              for k in names]) if names else np.zeros(0)
        bound = float(request.config["range"])
        big = np.abs(vec)
        if vec.size and not (np.all(np.isfinite(vec)) and big.max() <= bound):
            j = int(np.argmax(np.where(np.isfinite(big), big, np.inf)))
            where = np.cumsum([int(np.prod(s)) for _, s in layout])
            name = names[int(np.searchsorted(where, j, side="right"))]
            return client.reply(request, {"overflow": np.array([float(vec[j]), a]),
                                          "name": _text(name)},
                                batch_size=reply.batch_size)
        f = int(request.config["bits"])
        words = np.rint(vec * 2.0 ** f).astype(np.int64)
        if request.config.get(DP_NOISE):
            # distributed differential privacy: this participant's share of the noise, in
            # integers (the discrete Gaussian: the masks' sum stays exact), never seen alone
            words = _noised(words, names, layout, request, len(ids2), f, bound, client, a,
                            reply.batch_size)
            if isinstance(words, Reply):
                return words
        masked = words.view(np.uint64)
        masked += prg(kdf(st["b"], f"self|{agg}"), vec.size)
        s_pk = st["s_pk"]
        for j, v in enumerate(st["ids1"]):
            if v == me or v not in ids2:
                continue
            mask = prg(kdf(st["s"].exchange(_pk(s_pk[j])), f"mask|{agg}"), vec.size)
            if me < v:
                masked += mask
            else:
                masked -= mask
        return Reply(me, request.task, request.round, reply.num_rows, reply.batch_size,
                     {"masked": masked, "layout": _text(json.dumps(layout))})


def _noised(words, names, layout, request: Request, parties: int, f: int, bound: float,
            client, weight: float, batch: int):
    """``words`` (the fixed-point weighted arrays) plus a discrete Gaussian of standard
    deviation sigma 2^f / sqrt(parties) on every array not exempt (``DP_EXEMPT``), sigma the
    request's ``DP_NOISE``; or the overflow reply when a noised word leaves the range."""
    from .accounting import DP_EXEMPT, discrete_gaussian

    exempt = str(request.config.get(DP_EXEMPT, ""))
    sizes = [int(np.prod(s)) for _, s in layout]
    noisy = np.concatenate([np.full(n, not (exempt and k.endswith(exempt)))
                            for k, n in zip(names, sizes)]) if names else np.zeros(0, bool)
    share = float(request.config[DP_NOISE]) * 2.0 ** f / math.sqrt(max(parties, 1))
    rng = np.random.default_rng(secrets.randbits(128))      # the client's own secret
    words = words.copy()
    words[noisy] += discrete_gaussian(rng, share, int(noisy.sum()))
    top = np.abs(words.astype(float)) * 2.0 ** -f
    if words.size and top.max() > bound:
        j = int(np.argmax(top))
        name = names[int(np.searchsorted(np.cumsum(sizes), j, side="right"))]
        return client.reply(request, {"overflow": np.array([float(words[j]) * 2.0 ** -f,
                                                            weight]),
                                      "name": _text(name)}, batch_size=batch)
    return words


def unmask_task(client, request: Request) -> Reply:
    """Step 4: shares of b_v for the survivors and of s_v's key for the dropped, never both."""
    st = _state(client, request)
    me = client.index
    alive, dropped = _ids(request, "survivors"), _ids(request, "dropped")
    ids2 = st.get("ids2", [])
    if (set(alive) & set(dropped) or not set(alive) | set(dropped) <= set(ids2)
            or len(alive) < st["threshold"] or me not in alive):
        raise SecureAggregationError(f"client {me}: refusing to unmask: survivors {alive} and "
                                     f"dropped {dropped} must split the masked step's "
                                     f"{ids2}, with at least {st['threshold']} survivors")
    agg = request.config[ID]
    c_pk, ids1 = st["c_pk"], st["ids1"]

    def shares_of(v):
        if v == me:
            return st["own"]
        ct = st["inbox"][v]
        key = kdf(st["c"].exchange(_pk(c_pk[ids1.index(v)])), f"share|{agg}")
        plain = AESGCM(key).decrypt(ct[:12], ct[12:], agg.encode())
        if int.from_bytes(plain[:4], "big") != v or int.from_bytes(plain[4:8], "big") != me:
            raise SecureAggregationError(f"client {me}: a share addressed wrongly")
        return plain[8:8 + SHARE_BYTES], plain[8 + SHARE_BYTES:]

    b = np.array([np.frombuffer(shares_of(v)[0], np.uint8) for v in alive], dtype=np.uint8)
    s = np.array([np.frombuffer(shares_of(v)[1], np.uint8) for v in dropped],
                 dtype=np.uint8).reshape(len(dropped), SHARE_BYTES)
    _store(client).pop(agg, None)              # done: the secrets go
    return client.reply(request, {"b_shares": b, "s_shares": s})


def export_state(client) -> dict:
    """This client's secrets of the aggregations in progress, as plain arrays (``"agg/field"``
    -> uint8 or int64 array), for an engine that does not route the four messages of an
    aggregation to the same live ``Client`` object but keeps per-node state between messages
    on the client's side (e.g. Flower's ``Context.state`` on a SuperNode). Never send them to
    the server: they are the private keys. :func:`import_state` puts them back."""
    out = {}
    for agg, st in _store(client).items():
        p = f"{agg}/"
        out[p + "c"] = np.frombuffer(st["c"].private_bytes_raw(), np.uint8).copy()
        out[p + "s"] = np.frombuffer(st["s"].private_bytes_raw(), np.uint8).copy()
        out[p + "b"] = np.frombuffer(st["b"], np.uint8).copy()
        if "ids1" in st:
            out[p + "ids1"] = np.array(st["ids1"], dtype=np.int64)
            out[p + "c_pk"], out[p + "s_pk"] = st["c_pk"].copy(), st["s_pk"].copy()
            out[p + "threshold"] = np.array([st["threshold"]], dtype=np.int64)
            out[p + "own"] = np.frombuffer(st["own"][0] + st["own"][1], np.uint8).copy()
        if "ids2" in st:
            out[p + "ids2"] = np.array(st["ids2"], dtype=np.int64)
            senders = sorted(st["inbox"])
            out[p + "inbox_from"] = np.array(senders, dtype=np.int64)
            out[p + "inbox"] = np.array([np.frombuffer(st["inbox"][v], np.uint8)
                                         for v in senders],
                                        dtype=np.uint8).reshape(len(senders), CIPHER_BYTES)
    return out


def import_state(client, arrays: Mapping) -> None:
    """Restore on ``client`` the secrets saved by :func:`export_state` (replacing its own)."""
    store = _store(client)
    store.clear()
    for agg in sorted({k.rsplit("/", 1)[0] for k in arrays}):
        def get(field):
            return np.asarray(arrays[f"{agg}/{field}"])
        st = {"c": X25519PrivateKey.from_private_bytes(get("c").tobytes()),
              "s": X25519PrivateKey.from_private_bytes(get("s").tobytes()),
              "b": get("b").tobytes()}
        if f"{agg}/ids1" in arrays:
            own = get("own").tobytes()
            st.update(ids1=[int(i) for i in get("ids1")], c_pk=get("c_pk").copy(),
                      s_pk=get("s_pk").copy(), threshold=int(get("threshold")[0]),
                      own=(own[:SHARE_BYTES], own[SHARE_BYTES:]))
        if f"{agg}/ids2" in arrays:
            st["ids2"] = [int(i) for i in get("ids2")]
            st["inbox"] = {int(v): row.tobytes() for v, row in zip(get("inbox_from"),
                                                                    get("inbox"))}
        store[agg] = st


def client_tasks(tasks: Mapping) -> dict:
    """A client's task table for secure aggregation: every task masked, plus steps 1, 2, 4."""
    out = {name: MaskedTask(h) for name, h in tasks.items()}
    out.update({KEYS: keys_task, SHARES: shares_task, UNMASK: unmask_task})
    return out


def _text(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8).copy()


def _untext(a) -> str:
    return np.asarray(a, dtype=np.uint8).tobytes().decode()


# -- the server side ------------------------------------------------------------------------------

class SecureAggregation:
    """The server's side: runs the four steps through the gatherer's transport and returns
    the sum as one reply (``client == AGGREGATE``, num_rows = batch_size = N, arrays
    N sum_u a_u x_u, so the usual weight N / (N N) gives back sum_u a_u x_u).

    Args:
      sizes: N_i of every client.
      value_range: ``secure_range``, the largest |a_u x| a client may send.
    """

    def __init__(self, sizes: Sequence[int], value_range: float):
        self.sizes = [int(n) for n in sizes]
        self.num_samples = int(sum(self.sizes))
        self.range = float(value_range)

    def collect(self, gatherer, request: Request, participants: Optional[Sequence[int]],
                factors, kind: str):
        clients = list(range(len(self.sizes))) if participants is None else list(participants)
        hc = np.ones(len(clients)) if factors is None else np.asarray(factors, dtype=float)
        tolerate = gatherer.drop
        transport = gatherer.transport
        sharded = getattr(transport, "sharded", False)
        if sharded:
            # the shards are the protocol's participants: each masks its clients' sum
            # (:meth:`~.shards.ShardWorker._masked`); the clients' factors travel with the
            # masked request, each shard's own factor is 1
            order = transport.shards_holding(clients)
            h = np.ones(len(order))
            stream_of = transport.worker_stream
        else:
            order, h, stream_of = clients, hc, transport.stream
        party = "shard" if sharded else "client"
        factor = dict(zip(order, h))
        agg = f"{request.task}|{request.round}|{secrets.token_hex(8)}"
        threshold = len(order) // 2 + 1
        bits = fraction_bits(self.range, len(order))
        failed: dict[int, str] = {}
        up = {i: 0 for i in order}
        down = {i: 0 for i in order}

        def step(req, who, label):
            """Replies of ``who`` to ``req`` by client; the failed ones go to ``failed``."""
            got = {}
            words = req.num_floats()
            for item in _replies(stream_of(req, who, tolerate), who, req):
                down[item.client] += words
                if isinstance(item, Dropout):
                    failed[item.client] = f"{label}: {item.error}"
                else:
                    up[item.client] += item.num_floats()
                    got[item.client] = item
            return got

        def enough(who, label):
            if len(who) >= threshold:
                return
            self._count(gatherer, kind, order, up, down)
            drops = self._dropouts(request, order, who, failed)
            if not who:
                raise RoundFailedError(request, self._clients_of(transport, request, clients,
                                                                 drops) if sharded else drops)
            raise SecureAggregationError(
                f"secure aggregation of {request.task!r} at round {request.round}: only "
                f"{len(who)} of the {len(order)} {party}s answered {label}, fewer than the "
                f"threshold {threshold} needed to remove the masks; failures: "
                + "; ".join(f"client {d.client}: {d.error}" for d in drops[:5]))

        empty = np.zeros(0)
        keys = step(Request(KEYS, request.round, empty, {ID: agg}), order, "key exchange")
        u1 = [i for i in order if i in keys]
        enough(u1, "the key exchange")
        c_pk = np.array([keys[i].arrays["c_pk"] for i in u1], dtype=np.uint8)
        s_pk = np.array([keys[i].arrays["s_pk"] for i in u1], dtype=np.uint8)
        shares = step(Request(SHARES, request.round, empty, {ID: agg, "threshold": threshold},
                              {"ids": np.array(u1, dtype=np.int64), "c_pk": c_pk,
                               "s_pk": s_pk}), u1, "sharing the seeds")
        u2 = [i for i in u1 if i in shares]
        enough(u2, "the seed sharing")
        pos1 = [u1.index(i) for i in u2]
        cipher = np.array([np.asarray(shares[i].arrays["cipher"])[pos1] for i in u2],
                          dtype=np.uint8)
        del shares
        extra_config, extra_arrays = {}, {}
        if sharded:
            extra_config, extra_arrays = transport.shard_request(
                clients, participants, factors, "sum", tolerate)
        masked_request = replace(
            request, config={**request.config, **extra_config, ID: agg,
                             "num_samples": self.num_samples, "bits": bits,
                             "range": self.range},
            arrays={**request.arrays, **extra_arrays, "ids": np.array(u2, dtype=np.int64),
                    "cipher": cipher, "factor": np.array([factor[i] for i in u2])})
        total, layout, overflow = None, None, []
        answered, inner_drops = [], []
        words = masked_request.num_floats()
        stream = stream_of(masked_request, u2, tolerate)
        for item in _replies(stream, u2, masked_request):              # summed as they come
            down[item.client] += words
            if isinstance(item, Dropout):
                failed[item.client] = f"masked step: {item.error}"
                continue
            up[item.client] += item.num_floats()
            if "overflow" in item.arrays:
                overflow.append(item)
                continue
            if sharded:
                item = transport.take_members(item, answered, inner_drops)
            if not (isinstance(item.arrays.get("masked"), np.ndarray)
                    and item.arrays["masked"].dtype == np.uint64
                    and item.arrays["masked"].ndim == 1
                    and set(item.arrays) == {"masked", "layout"}):
                raise SecureAggregationError(
                    f"client {item.client}: its masked reply to {request.task!r} (round "
                    f"{request.round}) is not one uint64 vector with its layout (arrays "
                    f"{sorted(item.arrays)}"
                    + (f", 'masked' of dtype {item.arrays['masked'].dtype} and shape "
                       f"{item.arrays['masked'].shape}"
                       if isinstance(item.arrays.get("masked"), np.ndarray) else "") + ")")
            if layout is None:
                layout = _untext(item.arrays["layout"])
            elif _untext(item.arrays["layout"]) != layout:
                raise SecureAggregationError(f"client {item.client}: its reply to "
                                             f"{request.task!r} has other arrays than the rest")
            x = item.arrays["masked"]
            if total is not None and x.shape != total.shape:
                raise SecureAggregationError(
                    f"client {item.client}: its masked reply to {request.task!r} has "
                    f"{x.size} numbers, the others' {total.size}")
            total = x.copy() if total is None else np.add(total, x, out=total)
            del item, x          # only the running sum (uniform while masked) is kept
        if overflow:
            o = overflow[0]
            value, a = (float(v) for v in o.arrays["overflow"])
            raise SecureAggregationError(
                f"secure aggregation: {party} {o.client}'s weighted value {value:.6g} in array "
                f"{_untext(o.arrays['name'])!r} of task {request.task!r} (round "
                f"{request.round}; its weight a = {a:.3g}) is outside secure_range = "
                f"{self.range:g}; values are never clipped: pass a larger secure_range (the "
                f"fixed-point step 2^-f then grows; now f = {bits})")
        u3 = [i for i in u2 if i not in failed]
        enough(u3, "the masked step")
        dropped = [i for i in u2 if i in failed]
        unmask = step(Request(UNMASK, request.round, empty, {ID: agg},
                              {"survivors": np.array(u3, dtype=np.int64),
                               "dropped": np.array(dropped, dtype=np.int64)}),
                      u3, "unmasking")
        holders = [i for i in u3 if i in unmask][:threshold]
        if len(holders) < threshold:
            enough(holders, "the unmasking")
        n = total.size
        for k, v in enumerate(u3):          # the survivors' self masks
            seed = combine_shares([(u + 1, np.asarray(unmask[u].arrays["b_shares"])[k]
                                    .tobytes()) for u in holders])
            total -= prg(kdf(seed, f"self|{agg}"), n)
        for k, v in enumerate(dropped):     # the pairwise masks the survivors added with v
            key = X25519PrivateKey.from_private_bytes(combine_shares(
                [(u + 1, np.asarray(unmask[u].arrays["s_shares"])[k].tobytes())
                 for u in holders]))
            for u in u3:
                mask = prg(kdf(key.exchange(_pk(s_pk[u1.index(u)])), f"mask|{agg}"), n)
                if u < v:
                    total -= mask
                else:
                    total += mask
        self._count(gatherer, kind, order, up, down)
        drops = self._dropouts(request, order, u3, failed)
        if sharded:
            # the clients of the shards that failed, and those a surviving shard left out
            kept = set(u3)
            drops = self._clients_of(transport, request, clients, drops) + [
                d for k, d in inner_drops if k in kept]
            answered = [i for k, i in answered if k in kept]
            gatherer.pending.extend(drops)
            s = gatherer.renormalisation(clients, hc, answered, request, drops)
        else:
            gatherer.pending.extend(drops)
            s = gatherer.renormalisation(order, h, u3, request, drops)
        sums = total.view(np.int64)
        # each survivor's weighted values are within secure_range (the clients check theirs),
        # so a sum beyond len(u3) times it means a masked reply was corrupted (or masked with
        # other keys): after unmasking it is uniform over the 64 bits, out of range at least
        # half the time per number
        reach = len(u3) * (self.range * 2.0 ** bits + 1)
        largest = float(np.max(np.abs(sums.astype(float)))) if n else 0.0
        if largest > reach:
            raise SecureAggregationError(
                f"secure aggregation of {request.task!r} at round {request.round}: the "
                f"unmasked sum holds {largest * 2.0 ** -bits:.3g}, more "
                f"than the {len(u3)} clients' weighted values within secure_range = "
                f"{self.range:g} can add up to: a masked reply was corrupted on its way or "
                f"masked with other keys (secure aggregation cannot tell whose: clients {u3})")
        values = sums.astype(float) * (self.num_samples * 2.0 ** -bits)
        arrays, at = {}, 0
        for name, shape in json.loads(layout):
            size = int(np.prod(shape))
            arrays[name] = values[at:at + size].reshape(shape)
            at += size
        yield Reply(AGGREGATE, request.task, request.round, self.num_samples,
                    self.num_samples, arrays, weight=float(s))

    @staticmethod
    def _clients_of(transport, request, clients, drops) -> list[Dropout]:
        """The Dropouts of the clients of the shards in ``drops`` (shard-level)."""
        order = np.asarray(clients, dtype=np.int64)
        return [d2 for d in drops for d2 in transport.member_dropouts(d.client, request, order,
                                                                      d.error)]

    @staticmethod
    def _dropouts(request, order, kept, failed) -> list[Dropout]:
        return [Dropout(i, request.task, request.round, failed.get(i, "left out"))
                for i in order if i not in kept and i in failed]

    @staticmethod
    def _count(gatherer, kind, order, up, down) -> None:
        for i in order:
            if up[i] or down[i]:
                gatherer.count(kind, up[i], down[i])


def _replies(stream, who: Sequence[int], request: Request):
    """The items of a transport's ``stream`` to ``who`` (in that order), each a Reply or a
    Dropout of one of them, else SecureAggregationError naming the client in whose place it
    came (a transport yields the participants' replies in their order)."""
    for k, item in enumerate(stream):
        if not (isinstance(item, (Reply, Dropout)) and item.client in who):
            place = f"client {who[k]}" if k < len(who) else f"item {k + 1} of {len(who)}"
            got = (f"a {type(item).__name__}" if not isinstance(item, (Reply, Dropout))
                   else f"the {type(item).__name__} of client {item.client!r}")
            raise SecureAggregationError(
                f"{place}: its reply to {request.task!r} (round {request.round}) is {got}, "
                f"not a Reply of one of the clients asked ({list(who)})")
        yield item
