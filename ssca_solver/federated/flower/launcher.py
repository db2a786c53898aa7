"""A Flower federation on this machine (tests, benchmarks, trying the deployment engine):
:class:`LocalFederation` starts a SuperLink and one SuperNode per client as child processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np

from .engines import _free_port


class LocalFederation:
    """A SuperLink and one SuperNode per client on 127.0.0.1 (free ports), each node holding
    its client's rows in ``directory/client{i}.npz`` (node config ``partition-id=i
    data='...'``): what docs/engines.md runs by hand on several machines, here as child
    processes. Every process is recorded by PID (:attr:`pids`) and stopped by that PID in
    :meth:`close` (SIGTERM, then SIGKILL after ``grace`` seconds).

    Args:
      data: the FederatedData whose blocks the nodes hold.
      directory: where the .npz files, logs and FLWR_HOME go.
    """

    def __init__(self, data, directory, grace: float = 15.0):
        self.directory = os.fspath(directory)
        self.grace = grace
        self.procs: list = []
        port = _free_port()
        self.superlink = f"127.0.0.1:{port}"
        env = {**os.environ, "FLWR_HOME": os.path.join(self.directory, "flwr-home")}
        bindir = os.path.dirname(sys.executable)
        tool = lambda name: shutil.which(name, path=bindir) or name   # noqa: E731
        try:
            self._start([tool("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                         "--port", str(port), "--disable-runtime-dependency-installation"],
                        "superlink.log", env)
            for i, c in enumerate(data.clients):
                path = os.path.join(self.directory, f"client{i}.npz")
                np.savez(path, **({"X": c.X} if c.y is None else {"X": c.X, "y": c.y}))
                self._start([tool("flower-supernode"), "--insecure", "--superlink",
                             self.superlink, "--port", str(_free_port()), "--node-config",
                             f"partition-id={i} data='{path}'"], f"supernode{i}.log", env)
        except BaseException:
            self.close()
            raise

    def _start(self, argv, log_name, env):
        with open(os.path.join(self.directory, log_name), "w") as log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               env=env, stdin=subprocess.DEVNULL))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + self.grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
