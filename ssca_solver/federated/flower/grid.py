"""The server side of one run: :class:`GridSession` pushes requests to the nodes through a
Flower ``Grid`` and pulls their replies, after a handshake that maps client i to the node whose
``partition-id`` is i."""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from ...errors import ClientError
from ..messages import Request
from .codec import _META, MESSAGE_TYPE, _outcome, pack


class GridSession:
    """Requests out and replies in through one Flower ``Grid`` (where the Grid lives).

    Args:
      grid: the ServerApp's Grid.
      num_clients: I; the handshake maps client i to the node whose ``partition-id`` is i.
      start_timeout: seconds to wait for every node to join and answer the handshake.
      extra: client -> metadata sent with each of its requests (deployment: its seed and
        task-table hash; None in simulation).
      tasks_blob: client -> its pickled task table (deployment; None in simulation).
    """

    def __init__(self, grid: Grid, num_clients: int, start_timeout: float,
                 extra: Optional[dict] = None, tasks_blob: Optional[dict] = None):
        self.grid = grid
        self.num_clients = int(num_clients)
        self.extra = dict(extra or {})
        self.tasks_blob = tasks_blob
        self.pending: dict = {}          # token -> {message id: client}
        self._next = 0
        self.nodes = self._handshake(float(start_timeout))

    def _handshake(self, start_timeout: float) -> dict:
        deadline = time.monotonic() + start_timeout
        hello = Request("hello", 0, np.zeros(0))
        found: dict = {}
        asked: set = set()
        pending: dict = {}
        while len(found) < self.num_clients:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            if new:
                msgs = [Message(pack(hello, {"hello": True}), dst_node_id=n,
                                message_type=MESSAGE_TYPE, group_id="hello") for n in new]
                for mid, n in zip(self.grid.push_messages(msgs), new):
                    pending[mid] = n
                asked.update(new)
            for msg in (self.grid.pull_messages(list(pending)) if pending else ()):
                n = pending.pop(msg.metadata.reply_to_message_id, None)
                if n is None:
                    continue
                if msg.has_error() or "partition" not in msg.content[_META]:
                    why = msg.error.reason if msg.has_error() else "no partition in its answer"
                    raise ClientError("?", "start", f"Flower node {n} failed the handshake: "
                                      f"{why}")
                p = int(msg.content[_META]["partition"])
                if not 0 <= p < self.num_clients:
                    raise ValueError(f"Flower node {n} has partition-id {p}, but there are "
                                     f"{self.num_clients} clients (partition-id 0.."
                                     f"{self.num_clients - 1})")
                if p in found:
                    raise ValueError(f"Flower nodes {found[p]} and {n} both have "
                                     f"partition-id {p}: give each node its own")
                found[p] = n
            if len(found) < self.num_clients:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.num_clients)) - set(found))
                    raise ClientError(missing[0], "start", f"no Flower node answered for "
                                      f"partition-id(s) {missing} within flower_start_timeout="
                                      f"{start_timeout:g} s ({len(asked)} node(s) joined)")
                time.sleep(0.02)
        return found

    def send(self, request: Request, participants: Sequence[int], ttl: float,
             guard: Optional[dict] = None) -> int:
        """Push one message per participant; a token for :meth:`poll`. ``guard`` (None: none),
        in the simulation: ``deadline``, when the server stops waiting for the answers (a
        ``time.time()``); ``kill_at``, when a client still busy ends its process; ``busy``,
        the directory where a busy client marks its process (:func:`~.clientapp.deadline_guard`);
        in a deployment: ``kill_in``, seconds from when a node's ClientApp takes the message
        (its own clock) to when it ends its process if the client is still busy."""
        msgs = []
        due = dict(guard or {})
        for i in participants:
            content = pack(request, {**self.extra.get(i, {}), "client": int(i), **due})
            if self.tasks_blob is not None:
                content["ssca.tasks"] = ConfigRecord({"tasks": self.tasks_blob[i]})
            msgs.append(Message(content, dst_node_id=self.nodes[i], message_type=MESSAGE_TYPE,
                                group_id=str(request.round), ttl=ttl))
        ids = list(self.grid.push_messages(msgs))
        self._next += 1
        self.pending[self._next] = dict(zip(ids, participants))
        return self._next

    def poll(self, token: int, wait: float) -> list:
        """[(client, Reply or _Failure)] of the replies that arrived, waiting up to ``wait``
        seconds for at least one."""
        ids = self.pending.get(token, {})
        deadline = time.monotonic() + wait
        pause = 0.002
        while ids:
            out = []
            for msg in self.grid.pull_messages(list(ids)):
                i = ids.pop(msg.metadata.reply_to_message_id, None)
                if i is not None:
                    out.append((i, _outcome(msg, self.nodes[i])))
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 0.02)
        return []

    def forget(self, token: int) -> None:
        self.pending.pop(token, None)
