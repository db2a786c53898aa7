"""Benchmarks of the closed-form path on the paper's network (Section V).

1. Closed form vs CVXPY + Clarabel on the same Problem 5 built from real client statistics of
   the 784-J-10 network on Fashion-MNIST, J in {16, 32, 64, 128} (d = 12,704 ... 101,632),
   M in {0, 1, 4}: time per solve (median of repeats; cold, and warm-started from the answer's
   multipliers as a round does), speed-up, agreement.
2. Per-round time at the paper's scale (I = 10 clients, B = 100, J = 128): client statistics
   vs server update (combine, recursive average, closed-form subproblem, eq. (updatew)), for
   the session-1 server, ``driver.step`` and the whole ``Runner`` round.
3. The client kernel against the BLAS products it contains, same shapes, same run.
All three with one BLAS thread. The machine's load average is recorded: on a shared 2-core
machine other processes slow the clients (and so lower the server's share).

Usage:  python benchmarks/section_v.py [--quick] [--data-dir DIR]
Writes benchmarks/results/section_v.json and section_v.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, machine_title, median_time, write_json  # noqa: E402
from problems.mlp import MLP, _forward_backward, classification_con, classification_uncon  # noqa: E402,E501
from ssca_solver.methods.ssca import step as driver  # noqa: E402
from ssca_solver.datasets import fashion_mnist  # noqa: E402
from ssca_solver.methods.ssca.algorithm import SSCA, SSCARoundTask  # noqa: E402
from ssca_solver.subproblems import SubproblemSolver  # noqa: E402
from ssca_solver.federated import InProcessTransport, Request, build_clients  # noqa: E402
from ssca_solver.engine.options import seed_entropy  # noqa: E402
from ssca_solver.schedules import PowerStep  # noqa: E402
from ssca_solver.engine.session import Session  # noqa: E402
from ssca_solver.subproblems import (ClosedFormSubproblem, CvxpySubproblem,  # noqa: E402
                                     make_subproblem)

GROUPS = [(0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]
TAU, BATCH = 0.1, 100


def make_clients(prob, seed=0):
    """The clients of ``prob`` answering SSCA's round task, as ``solve`` builds them."""
    return build_clients(prob.data, seed_entropy(seed),
                         {"ssca.round": SSCARoundTask(prob.functions, prob.builders)})


def round_request(t, w):
    """SSCA's round request (what ``SSCA.request`` sends) at B = 100, tau = 0.1."""
    return Request("ssca.round", t, w, {"batch_size": BATCH, "tau": TAU})


def group_loss(net, group, frac):
    """Cross-entropy on the rows whose label is in ``group``, as a mean over that group."""
    ce = net.cross_entropy()
    labels = np.array(group)

    def value_and_grad(w, X, y):
        mask = np.isin(y, labels)
        v = np.zeros(len(y))
        g = np.zeros(net.dim)
        if mask.any():
            vm, gm = ce.value_and_grad(w, X[mask], y[mask])
            v[mask] = vm / frac
            g = gm * mask.sum() / len(y) / frac
        return v, g

    return ss.SampleFunction(lambda w, X, y: value_and_grad(w, X, y)[0],
                             lambda w, X, y: value_and_grad(w, X, y)[1],
                             name=f"CE{group}", value_and_grad=value_and_grad)


def build(net, data, y_all, M):
    if M == 0:
        return classification_uncon(data, net, lam=1e-5)
    if M == 1:
        return classification_con(data, net, U=0.13)
    fns = [group_loss(net, g, np.isin(y_all, g).mean()) for g in GROUPS[:M]]
    import cvxpy as cp
    return ss.Problem(lambda w: cp.sum_squares(w), [f <= 1.5 for f in fns], dim=net.dim,
                      data=data)


def _formed(sol):
    sol.w
    return sol


def part1(X, y, Js, Ms, repeats, cvxpy_repeats):
    """Closed form vs CVXPY with one BLAS thread, as parts 2 and 3: with OpenBLAS's two
    threads, whenever another process kept the second core busy the closed form's few dot
    products waited for the scheduler (4-16 ms instead of 0.02-0.05 ms per solve, measured
    while other test suites ran on this 2-core machine)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _part1(X, y, Js, Ms, repeats, cvxpy_repeats)


def _part1(X, y, Js, Ms, repeats, cvxpy_repeats):
    rows = []
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    for J in Js:
        net = MLP(784, J, 10)
        for M in Ms:
            prob = build(net, data, y, M)
            msgs = InProcessTransport(make_clients(prob, 0)).exchange(
                round_request(1, net.init(0)))
            stats = driver.average_statistics(
                driver.init(net.init(0), prob.builders, TAU, "tau").stats,
                driver.combine(msgs, data.num_samples), 0.9)
            lam = prob.deterministic.norm2_coefficient()
            cf = ClosedFormSubproblem(net.dim, prob.builders, prob.objective is not None,
                                      prob.bounds, lam)
            # .w: w-bar formed, like CVXPY's answer (the solver alone leaves it as its terms).
            # Cold: no warm start (nu0=None), as CVXPY+Clarabel solve. Warm: nu0 = the answer's
            # multipliers, as a round passes state.nu (M >= 2; M <= 1 ignores nu0); the solver
            # of session 1 kept its last multipliers itself, so its repeats were warm.
            t_cf, s_cf = median_time(lambda: _formed(cf.solve(stats, 1e5, 1)), repeats, warmup=2)
            nu = np.array(s_cf.multipliers)
            t_warm, _ = median_time(lambda: _formed(cf.solve(stats, 1e5, 1, nu0=nu)), repeats,
                                    warmup=2)
            cv = CvxpySubproblem(net.dim, prob.builders, prob.objective is not None,
                                 prob.bounds, prob.deterministic)
            t_cv, s_cv = median_time(lambda: cv.solve(stats, 1e5, 1), cvxpy_repeats, warmup=0)
            err = float(np.linalg.norm(s_cf.w - s_cv.w) / max(np.linalg.norm(s_cv.w), 1e-300))
            t_ipm = float(cv.problem.solver_stats.solve_time)  # Clarabel alone, last solve
            row = {"J": J, "d": net.dim, "M": M, "closed_form_s": t_cf,
                   "closed_form_warm_s": t_warm, "cvxpy_s": t_cv,
                   "clarabel_solve_only_s": t_ipm, "speedup": t_cv / t_cf,
                   "speedup_vs_clarabel_alone": t_ipm / t_cf, "primal_rel_err": err,
                   "multipliers_closed_form": s_cf.multipliers.tolist(),
                   "multipliers_cvxpy": s_cv.multipliers.tolist(),
                   "cvxpy_parametrized": cv.parametrize, "blas_threads": 1}
            rows.append(row)
            log(f"[1] d={net.dim:>7d} M={M}: closed form {t_cf * 1e3:8.3f} ms (warm "
                f"{t_warm * 1e3:.3f} ms), CVXPY+Clarabel "
                f"{t_cv:7.3f} s (Clarabel alone {t_ipm:7.3f} s), speed-up {t_cv / t_cf:9.0f}x "
                f"({t_ipm / t_cf:8.0f}x vs Clarabel alone), rel. error {err:.1e}")
    return rows


def part2(X, y, rounds):
    """Round time with one BLAS thread (each client is its own machine in a deployment; with
    OpenBLAS's two threads on this 2-core machine the same round measured 3-4x slower and
    noisier, the threads contending with NumPy's element-wise work)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _part2(X, y, rounds)


class _TimedSubproblem(SubproblemSolver):
    """The subproblem with the time of each solve recorded."""

    def __init__(self, sub):
        self.sub, self.name, self.last = sub, sub.name, 0.0

    def solve(self, stats, penalty, round, nu0=None, center=None):
        t0 = time.perf_counter()
        sol = self.sub.solve(stats, penalty, round=round, nu0=nu0)
        self.last = time.perf_counter() - t0
        return sol


def _timed_stream(clients, request, clock):
    """``InProcessTransport.stream`` with its two parts timed apart: the one read-only copy of
    w_t the clients share (the in-process stand-in for the broadcast, clock[1]) and the
    clients' own work (clock[0])."""
    t0 = time.perf_counter()
    request = request.read_only()
    clock[1] += time.perf_counter() - t0
    for c in clients:
        t1 = time.perf_counter()
        msg = c.handle(request)
        clock[0] += time.perf_counter() - t1
        yield msg


class _TimedTransport(InProcessTransport):
    """The in-process transport with its stream timed as ``_timed_stream`` (set ``clock``)."""

    clock = None

    def stream(self, request):
        return _timed_stream(self._clients, request, self.clock)


def _runner(prob, net):
    """``Runner``, state and timed subproblem exactly as ``solve_ssca`` builds them for part 2's
    round (same seed, x0, schedules, B, tau and c as the other designs), on a timed transport."""
    opts = {"eval_every": None, "batch_size": BATCH, "tau": TAU, "seed": 0, "x0": net.init(0),
            "rho": PowerStep(0.6, 0.3), "gamma": PowerStep(0.9, 0.35)}
    if prob.num_constraints:
        opts["penalty"] = [1e5]
    o = SSCA.parse(prob, opts)
    alg = SSCA.build(prob, o, opts)
    alg.config = dataclasses.replace(alg.config,
                                     subproblem=_TimedSubproblem(alg.config.subproblem))
    sub = alg.config.subproblem
    session = Session(prob, alg, o)
    session.transport.close()
    # the runner reaches the clients only through its gatherer: the timed transport goes there
    transport = _TimedTransport(build_clients(prob.data, seed_entropy(0), alg.tasks()))
    session.transport = session.runner.gatherer.transport = transport
    return session.runner, session.state, sub, transport


BLOCK = 10
DESIGNS = ("axpy_per_message", "library", "runner")  # part 2's designs, alternated in blocks


def _reference_step(state, messages, num_samples, rho, gamma, subproblem):
    """The server as session 1 built it, for comparison: after all messages arrived, one
    scaling pass and one axpy per message and statistic (each reply's array "m:name" read
    from its flat ``arrays``, as the library reads it), then eq. (updatew) as a scaling and an
    axpy, and the step norm as a separate pass. Same signature and state as ``driver.step``
    (penalty from ``state.penalty``, the multipliers' warm start ``state.nu``)."""
    from ssca_solver._kernels import axpy, scaled

    messages = list(messages)
    stats = []
    for m, p in enumerate(state.stats):
        acc = {k: scaled(1.0 - rho, v) for k, v in p.items()}
        for msg in messages:
            wgt = rho * msg.num_rows / (msg.batch_size * num_samples)
            for k in p:
                axpy(wgt, msg.arrays[driver.stat_key(m, k)], acc[k])
        stats.append(acc)
    sol = subproblem.solve(tuple(stats), state.penalty, round=state.t + 1, nu0=state.nu)
    w = scaled(1.0 - gamma, state.w)
    axpy(gamma, sol.w, w)
    np.linalg.norm(sol.w - state.w)
    return driver.SSCAState(state.t + 1, w, tuple(stats), state.penalty,
                            np.asarray(sol.multipliers, dtype=float)), None


def _part2(X, y, rounds):
    """The library's round (``driver.step`` on the in-process stream) against the session-1
    server (``_reference_step``), and the whole round as ``solve`` runs it (``Runner.run``: the
    request, the counted stream, ``SSCA.step``'s schedules, the history row), in alternating
    blocks, same subproblem. Clients = time inside the clients' ``handle``; broadcast = the
    copies of w_t the in-process transport makes for them; server = the rest of the round:
    averaging, subproblem, eq. (updatew) (and, for the runner, its bookkeeping)."""
    out = {}
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    net = MLP(784, 128, 10)
    for kind in ("uncon", "con"):
        modes = {k: v for k, v in (("axpy_per_message", _reference_step),
                                   ("library", driver.step), ("runner", None)) if k in DESIGNS}
        prob = classification_uncon(data, net, 1e-5) if kind == "uncon" else \
            classification_con(data, net, 0.13)
        runs = {}
        for mode in modes:
            if mode == "runner":
                runner, state, sub, transport = _runner(prob, net)
                runs[mode] = {"sub": sub, "runner": runner, "transport": transport,
                              "state": state, "client": [], "broadcast": [], "server": [],
                              "subproblem": []}
                continue
            sub = _TimedSubproblem(make_subproblem(prob, prob.builders, "auto"))
            runs[mode] = {"sub": sub, "clients": make_clients(prob, 0),
                          "state": driver.init(net.init(0), prob.builders, TAU, "tau",
                                               num_constraints=prob.num_constraints,
                                               penalty=1e5),
                          "client": [], "broadcast": [], "server": [], "subproblem": []}
        # blocks of BLOCK rounds, the designs alternating (ABAB...): interleaving single rounds
        # made each design run on caches the other had just filled (both measured ~0.4 ms
        # slower); the first round of each block is left out of the medians for that reason
        for t, mode in ((t, mode) for b in range(0, rounds, BLOCK) for mode in modes
                        for t in range(b + 1, min(b + BLOCK, rounds) + 1)):
            step = modes[mode]
            r = runs[mode]
            clock = [0.0, 0.0]
            if mode == "runner":
                r["transport"].clock = clock
                t0 = time.perf_counter()
                r["state"], _ = r["runner"].run(r["state"], 1)
                total = time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                msgs = _timed_stream(r["clients"], round_request(t, r["state"].w), clock)
                r["state"], _ = step(r["state"], msgs, data.num_samples, 0.6 / t ** 0.3,
                                     0.9 / t ** 0.35, r["sub"])
                total = time.perf_counter() - t0
            if (t - 1) % BLOCK:
                r["client"].append(clock[0])
                r["broadcast"].append(clock[1])
                r["server"].append(total - clock[0] - clock[1])
                r["subproblem"].append(r["sub"].last)
        wa, wb = runs["axpy_per_message"]["state"].w, runs["library"]["state"].w
        out[kind] = {"subproblem": runs["library"]["sub"].name, "blas_threads": 1,
                     "rounds": rounds,
                     "iterates_rel_diff": float(np.linalg.norm(wa - wb) / np.linalg.norm(wa))}
        if "runner" in runs:
            wc = runs["runner"]["state"].w
            out[kind]["iterates_rel_diff_runner_vs_library"] = float(
                np.linalg.norm(wc - wb) / np.linalg.norm(wb))
        for mode in modes:
            r = runs[mode]
            c, b, srv = (float(np.median(r[k])) for k in ("client", "broadcast", "server"))
            cl, bc, sv = (np.asarray(r[k]) for k in ("client", "broadcast", "server"))
            share = sv / (cl + bc + sv)
            out[kind][mode] = {
                "client_stats_all_10_s": c, "client_stats_per_client_s": c / 10,
                "broadcast_copies_s": b, "server_update_s": srv,
                "server_subproblem_s": float(np.median(r["subproblem"])),
                "rounds_in_medians": len(r["server"]),
                "server_share_of_round": srv / (c + b + srv),
                "server_share_per_round_p10_p90": [float(np.percentile(share, 10)),
                                                   float(np.percentile(share, 90))],
                "server_and_broadcast_share_of_round": (srv + b) / (c + b + srv)}
            log(f"[2] {kind}, {mode:>16s}: 10 clients {c * 1e3:.1f} ms, copies of w {b * 1e3:.2f}"
                f" ms, server {srv * 1e3:.2f} ms (subproblem "
                f"{out[kind][mode]['server_subproblem_s'] * 1e3:.3f} ms) = "
                f"{100 * srv / (c + b + srv):.2f} % of the round (rounds' 10-90 %: "
                f"{100 * np.percentile(share, 10):.1f}-{100 * np.percentile(share, 90):.1f} %; "
                f"{100 * (srv + b) / (c + b + srv):.2f} % with the copies)")
        srv = {m: out[kind][m]["server_update_s"] for m in modes}
        out[kind]["server_ratio_reference_over_library"] = srv["axpy_per_message"] / srv["library"]
        log(f"[2] {kind}: server time, session-1 design / library = "
            f"{out[kind]['server_ratio_reference_over_library']:.2f}; iterates differ by "
            f"{out[kind]['iterates_rel_diff']:.1e} (session-1 vs library, relative)")
        if "runner" in runs:
            out[kind]["server_ratio_runner_over_library"] = srv["runner"] / srv["library"]
            log(f"[2] {kind}: server time, runner / library = "
                f"{out[kind]['server_ratio_runner_over_library']:.2f}; iterates differ by "
                f"{out[kind]['iterates_rel_diff_runner_vs_library']:.1e}")
    return out


def part3(X, y, repeats):
    """Kernel against its five BLAS products, one BLAS thread (as the clients of part 2), the
    two timed alternately so that drift of the machine affects both alike."""
    from threadpoolctl import threadpool_limits

    net = MLP(784, 128, 10)
    w1, w2, b1, b2 = net.unflatten(net.init(0))
    out = []
    with threadpool_limits(1):
        for n in (100, 1000):
            Xb = np.ascontiguousarray(X[:n])
            yb = np.ascontiguousarray(y[:n].astype(np.int64))
            H = Xb @ w1.T
            S = np.tanh(H)
            D = np.random.default_rng(0).random((n, 10))

            def kernel():
                _forward_backward(w1, w2, b1, b2, Xb, yb, 0, True)

            def blas():
                Xb @ w1.T
                S @ w2.T
                D.T @ S
                dS = D @ w2
                dS.T @ Xb

            times = {kernel: [], blas: []}
            for r in range(repeats + 2):
                for fn in (kernel, blas):
                    t0 = time.perf_counter()
                    fn()
                    if r >= 2:                          # two warm-up rounds
                        times[fn].append(time.perf_counter() - t0)
            t_kernel, t_blas = float(np.median(times[kernel])), float(np.median(times[blas]))
            out.append({"rows": n, "kernel_s": t_kernel, "blas_products_s": t_blas,
                        "ratio": t_kernel / t_blas, "blas_threads": 1})
            log(f"[3] n={n}: kernel {t_kernel * 1e3:.2f} ms, its 5 BLAS products "
                f"{t_blas * 1e3:.2f} ms, ratio {t_kernel / t_blas:.2f} (one BLAS thread)")
    return out


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["closed_form_vs_cvxpy"]
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.6))
    for i, M in enumerate(sorted({r["M"] for r in rows})):
        rr = [r for r in rows if r["M"] == M]
        d = [r["d"] for r in rr]
        col = f"C{i}"
        ax[0].loglog(d, [r["closed_form_s"] for r in rr], "o-", color=col,
                     label=f"closed form, M={M}")
        ax[0].loglog(d, [r["cvxpy_s"] for r in rr], "s--", color=col,
                     label=f"CVXPY+Clarabel, M={M}")
        ax[0].loglog(d, [r["clarabel_solve_only_s"] for r in rr], "x:", color=col,
                     label=f"Clarabel alone, M={M}")
        ax[1].semilogx(d, [r["speedup"] for r in rr], "o-", color=col, label=f"M={M}")
        ax[1].semilogx(d, [r["speedup_vs_clarabel_alone"] for r in rr], "x:", color=col,
                       label=f"M={M}, vs Clarabel alone")
    ax[0].set(xlabel="d", ylabel="seconds per solve (median)", title="Problem 5: time per solve")
    # in the empty band between the two families of curves
    ax[0].legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, 0.41))
    ax[1].set(xlabel="d", ylabel="time / closed-form time", title="speed-up", yscale="log")
    ax[1].legend(fontsize=7)
    names = {"axpy_per_message": "session 1", "library": "driver.step", "runner": "Runner"}
    rt = {f"{k}\n{names[m]}": v[m] for k, v in res["round_time"].items() for m in names}
    kinds = list(rt)
    base = np.array([rt[k]["client_stats_all_10_s"] * 1e3 for k in kinds])
    copies = np.array([rt[k]["broadcast_copies_s"] * 1e3 for k in kinds])
    ax[2].bar(kinds, base, label="10 clients")
    ax[2].bar(kinds, copies, bottom=base, label="copies of w (in-process broadcast)")
    ax[2].bar(kinds, [rt[k]["server_update_s"] * 1e3 for k in kinds], bottom=base + copies,
              label="server")
    for i, k in enumerate(kinds):
        ax[2].text(i, base[i] + copies[i],
                   f"server\n{100 * rt[k]['server_share_of_round']:.1f} %", ha="center",
                   va="bottom", fontsize=8)
    ax[2].set(ylabel="ms per round (median)", title="round at I=10, B=100, d=101,632")
    ax[2].legend()
    fig.suptitle(machine_title(res["machine"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="J in {16, 128}, fewer repeats")
    ap.add_argument("--data-dir", default=None, help="folder of Fashion-MNIST's IDX files")
    args = ap.parse_args(argv)
    (X, y), _ = fashion_mnist(args.data_dir)
    Js = [16, 128] if args.quick else [16, 32, 64, 128]
    start = time.perf_counter()
    res = {"command": " ".join(["python", "benchmarks/section_v.py"] + (argv or sys.argv[1:])),
           "machine": machine(), "data": "Fashion-MNIST train (60000 x 784)",
           "loadavg_at_start": os.getloadavg()}
    res["closed_form_vs_cvxpy"] = part1(X, y, Js, [0, 1, 4], 20 if args.quick else 50,
                                        1 if args.quick else 3)
    res["round_time"] = part2(X, y, 20 if args.quick else 100)
    res["kernel_vs_blas"] = part3(X, y, 20 if args.quick else 100)
    res["wall_time_s"] = time.perf_counter() - start
    res["loadavg_at_end"] = os.getloadavg()
    path = write_json("section_v", res)
    plot(res, RESULTS / "section_v.png")
    log(f"wrote {path} and {RESULTS / 'section_v.png'} in {res['wall_time_s']:.0f} s")


if __name__ == "__main__":
    main()
