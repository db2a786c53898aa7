"""Write docs/benchmarks.md from the benchmarks' results (benchmarks/results/*.json).

    python benchmarks/make_page.py            # writes docs/benchmarks.md
    python benchmarks/make_page.py --check    # exit 1 if docs/benchmarks.md is not up to date

Every figure of the page is read from a JSON file here; the page's prose says what each
benchmark measures and how to read its table, never a number. The table at the top names,
for every result, the command that wrote it, the library's commit, the date and the machine:
the commit the run recorded (``library.commit`` or ``published.commit``), else the commit that
last changed the file; likewise the date (``date``, ``published.date``, else that commit's
date). The JSON files differ in shape, one benchmark to the next: each known file has a
renderer below; a file without one is listed with its command and scalar fields, so that a
new benchmark shows up on the page before it has a renderer. Figures are linked where they
live (``../benchmarks/results/NAME.png``; ``mkdocs_hooks.py`` copies them into the site).
Needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
FIG = "../benchmarks/results"


# -- formatting ---------------------------------------------------------------------------------

def num(x, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, thousands separated, '—' for None/NaN."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:
            return "—"
        if x == int(x) and abs(x) < 1e6:
            return f"{int(x):,}"
        if 1e-3 <= abs(x) < 1e4:
            return f"{x:.{digits}g}"
        return f"{x:.{max(digits - 1, 1)}e}"
    return str(x)


def ms(seconds) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g} ms"


def sec(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.3g} s"


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |",
           "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out) + "\n"


def figure(name: str, caption: str) -> str:
    if not (RESULTS / name).exists():
        return ""
    return f"Figure: [{caption}]({FIG}/{name}).\n"


# -- where and when -----------------------------------------------------------------------------

def git_last(path: Path) -> tuple[str, str]:
    """(short commit, date) of the last commit that changed ``path``; ('—', '—') outside git."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %ad", "--date=short", "--",
                              str(path)], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
    return (out[0], out[1]) if len(out) == 2 else ("—", "—")


def machine_of(d: dict) -> str:
    m = d.get("machine")
    if isinstance(m, dict):
        cd = m.get("cpu_detail") or {}
        fam = f" (family {cd.get('family')}, model {cd.get('model')})" if cd.get("family") else ""
        return f"{m.get('cpu', '?')}{fam}, {m.get('cores', '?')} cores, Python {m.get('python', '?')}"
    if isinstance(m, str):
        return f"{m}, {d.get('cpus', '?')} cores, Python {d.get('python', '?')}"
    return "—"


def wall_of(d: dict):
    for k in ("wall_time_s", "wall_s", "total_time", "wall_seconds", "total_wall_s",
              "wall_total", "seconds"):
        if isinstance(d.get(k), (int, float)):
            return d[k]
    return None


def provenance(path: Path, d: dict) -> dict:
    pub = d.get("published") or {}
    git_commit, git_date = git_last(path)
    commit = ((d.get("library") or {}).get("commit") or d.get("commit") or pub.get("commit")
              or git_commit)
    date = d.get("date") or pub.get("date") or git_date
    command = pub.get("command") or d.get("command") or "—"
    if command.startswith("benchmarks/"):
        command = "python " + command
    return {"commit": str(commit)[:7], "date": str(date)[:10], "command": command.strip(),
            "machine": machine_of(d), "wall": wall_of(d)}


# -- renderers, one per result file -------------------------------------------------------------

def r_section_vi(d: dict) -> str:
    targets = d["targets"]
    head = (["method", "runs", "final test accuracy", "final training cost"]
            + [f"rounds to {t:.0%} accuracy (runs that reached it)" for t in targets])
    rows = []
    for name, e in d["table"].items():
        row = [name, e["runs"], f"{e['final_test_acc_mean']:.3f} ± {e['final_test_acc_std']:.3f}",
               f"{e['final_train_cost_mean']:.4f} ± {e['final_train_cost_std']:.4f}"]
        for t in targets:
            r = e[f"reach_{t:.2f}"]
            row.append("not reached" if r["rounds_mean"] is None else
                       f"{r['rounds_mean']:.0f} ± {r['rounds_std']:.0f} ({r['reached']})")
        rows.append(row)
    settings = d["paper_settings"]
    tuned = d["grid"]["chosen_ssca"]
    text = (f"Data: {d['data']}; R = {d['R']} runs per method, T = {d['T']} rounds, "
            f"B in {d['batch_sizes']}, tau = {d['tau']:g}, c = {d['c']:g}, "
            f"lambda = {d['lambda']:g}. \"SSCA B=b\" is the paper's setting "
            "(a1, a2, alpha) = " + ", ".join(f"{v} for B = {k}" for k, v in settings.items())
            + "; \"tuned\" is the best of the benchmark's grid: "
            + ", ".join(f"{k}: (a1, a2, alpha) = {v['a']}, tau = {v['tau']:g}"
                        for k, v in tuned.items())
            + ". The SGD baselines' learning rates were chosen by grid search the same way. "
            "\"SSCA-con\" is Algorithm 2 on the paper's (prob:class-con), min |w|^2 subject to "
            "the training cost <= U, with the tuned settings. Rounds to an accuracy: mean and "
            "spread over the runs that reached it.\n\n")
    return (text + table(head, rows) + "\n"
            + figure("section_vi_fig1.png", "training cost per round (Figure 1)") + "\n"
            + figure("section_vi_fig2.png", "test accuracy per round (Figure 2)") + "\n"
            + figure("section_vi_fig3.png", "|w|^2 against training cost (Figure 3)"))


def r_section_vi_long(d: dict) -> str:
    rows = []
    levels = sorted({k for e in d["table"].values() for k in e if k.startswith("reach_")})
    for name, e in d["table"].items():
        row = [name, e["runs"], f"{e['final_test_acc_mean']:.3f}",
               f"{e['final_train_cost_mean']:.4f}"]
        for lv in levels:
            r = e[lv]
            row.append("not reached" if r["rounds_mean"] is None else
                       f"{r['rounds_mean']:.0f} ({r['reached']})")
        rows.append(row)
    head = (["method", "runs", "final test accuracy", "final training cost"]
            + [f"rounds to {float(lv[6:]):.0%}" for lv in levels])
    return (f"The same comparison over T = {d['T']} rounds, R = {d['R']} runs.\n\n"
            + table(head, rows) + "\n" + figure("section_vi_long.png", "the long run"))


def r_section_v(d: dict) -> str:
    rows = [[r["J"], f"{r['d']:,}", r["M"], ms(r["closed_form_s"]), ms(r["cvxpy_s"]),
             ms(r["clarabel_solve_only_s"]), num(r["speedup"]), num(r["primal_rel_err"], 2)]
            for r in d["closed_form_vs_cvxpy"]]
    out = (f"Data: {d['data']}. One subproblem of the paper's network (hidden width J, "
           "M constraints) solved in closed form and by CVXPY + Clarabel.\n\n"
           + table(["J", "d", "M", "closed form", "CVXPY + Clarabel", "Clarabel's solve alone",
                    "speed-up", "relative difference of w"], rows))
    rows = []
    for kind, e in d["round_time"].items():
        lib = e["library"]
        rows.append([{"uncon": "Algorithm 1", "con": "Algorithm 2"}.get(kind, kind),
                     e["rounds"], ms(lib["client_stats_per_client_s"]),
                     ms(lib["server_update_s"]), ms(lib["server_subproblem_s"]),
                     f"{lib['server_share_of_round']:.1%}"])
    out += ("\nOne round at the paper's scale (784-128-10 network, 10 clients, B = 100, "
            "one BLAS thread), medians over the rounds:\n\n"
            + table(["algorithm", "rounds", "client statistics, per client", "server update",
                     "server subproblem", "server's share of the round"], rows))
    rows = [[r["rows"], ms(r["kernel_s"]), ms(r["blas_products_s"]), num(r["ratio"])]
            for r in d["kernel_vs_blas"]]
    out += ("\nThe client's Numba kernel against the same products in NumPy/BLAS:\n\n"
            + table(["rows", "kernel", "BLAS products", "ratio"], rows))
    return out + "\n" + figure("section_v.png", "closed form against CVXPY")


def r_defaults(d: dict) -> str:
    rows = []
    for name, p in d["problems"].items():
        s = p["summary"]["default"]
        rows.append([name, p["reference"].get("kind", ""), "/".join(s["statuses"]),
                     num(s.get("gap"), 2), num(s.get("violation"), 2),
                     num(s.get("multiplier_error"), 2), num(s.get("x_error"), 2),
                     num(s.get("kkt"), 2), f"{s['rounds']:.0f}", sec(s.get("time")),
                     "met" if s.get("targets_met") else "**missed**: " + "; ".join(s["misses"])])
    t = d["targets"]
    return ("Every problem of `problems/suite.py` solved with the default options "
            f"(`prob.solve(seed=s)`, seeds {d['seeds']}), against an independent reference "
            "(CVXPY + Clarabel on the pooled data; multi-start SLSQP for nonconvex problems). "
            "Columns are means over the seeds; gap, violation, multiplier and x errors are "
            f"relative. Targets: gap <= {t['gap']:g}, violation <= {t['violation']:g}, "
            f"multiplier error <= {t['multipliers']:g}, KKT residual <= {t['kkt']:g}, "
            f"|x - x_ref| <= {t['x']:g} (the infeasible problem: status \"infeasible\").\n\n"
            + table(["problem", "kind", "statuses", "gap", "violation", "multiplier error",
                     "x error", "KKT residual", "rounds", "time", "targets"], rows)
            + "\n" + figure("defaults.png", "default options on the suite"))


def r_ablation(d: dict) -> str:
    return ("The default options on the suite (seed 0) with one mechanism switched off at a "
            "time: `adaptive_batch` (the batch never grows), `full_from_round_1` "
            "(`batch_size=\"full\"` from the start), `tau_probe` (starting tau 1 instead of the "
            "measured curvature), `backtracking` (no full-batch step rejected, tau never "
            "shrinks), `diagonal_metric` (one scalar curvature always), "
            "`clarabel_tolerances` (Clarabel's own tolerances on the CVXPY path). Each cell: "
            "targets met or missed, status, rounds (r), rows read.\n\n"
            + d["table"].strip() + "\n\n" + figure("ablation.png", "the ablation"))


def r_constrained(d: dict, png: str) -> str:
    t = d["targets"]
    notes = "".join(f" {v}." for v in (d.get("notes") or {}).values()
                    if "network" in png or "network" not in v[:8])
    return ("Each method's rounds and floats (up + down, the algorithm's messages) until a "
            f"full-data evaluation has an objective within {t['gap']:g} (relative) of the "
            f"reference and a relative violation below {t['violation']:g}, mean ± spread over "
            "the runs that reached it. \"SSCA tuned\" and the baselines use the best setting of "
            "a grid chosen on separate seeds; every method has the same full-data KKT stopping "
            "test and a budget of rounds (status \"stopped\": the budget ran out)." + notes + "\n\n" + d["table"].strip() + "\n\n"
            + figure(png, "the comparison"))


def r_second_order(d: dict) -> str:
    def cell(e):
        return f"{e['status']}, {e['rounds']}" if e else "—"
    rows = [[p["problem"], p["slsqp"].get("nit"), cell(p.get("lbfgs")), cell(p.get("none"))]
            for p in d.get("classical", [])]
    out = ("The smooth programs of `problems/classical.py` (known optima; one client holding "
           "one row, so every round is a full batch), default options with "
           "`hessian=\"lbfgs\"` (the quasi-Newton model: their functions carry no Hessian, "
           "and the default `\"auto\"` differences their gradients into the Newton "
           "model's instead) and `\"none\"` (the paper's first-order "
           "surrogates), next to the iterations of SciPy's SLSQP from the same start; each "
           "cell: status, rounds.\n\n"
           + table(["problem", "SLSQP iterations", "lbfgs", "none"], rows))
    rows = [[num(p["U"]), num(p["reference"], 6), cell(p.get("lbfgs")), cell(p.get("none"))]
            for p in d.get("diabetes", [])]
    if rows:
        out += ("\nLeast squares on scikit-learn's diabetes data, 8 clients, subject to one "
                "group's mean squared error <= U (the first U inactive), against CVXPY + "
                "Clarabel on the pooled data (status, rounds):\n\n"
                + table(["U", "reference objective", "lbfgs", "none"], rows))
    rows = [[f"{p['N']:,}", p["d"], num(float(p["Nd"])), sec(p["slsqp"]["wall"]),
             cell(p.get("lbfgs")), sec(p["lbfgs"]["wall"]), num(p["lbfgs"].get("wall_vs_slsqp")),
             cell(p.get("none")), num(p["none"].get("wall_vs_slsqp"))]
            for p in d.get("pooled", [])]
    if rows:
        out += ("\nNeyman-Pearson logistic regression on synthetic data (N rows, d features, "
                "10 clients), against SciPy's SLSQP on the pooled data with exact gradients "
                "(wall-time ratios to SLSQP's):\n\n"
                + table(["N", "d", "N d", "SLSQP wall", "lbfgs", "lbfgs wall",
                         "lbfgs / SLSQP", "none", "none / SLSQP"], rows))
    return out + "\n" + figure("second_order.png", "the second-order phase")


def r_second_order_cost(d: dict) -> str:
    c = d["cost"]
    return ("The server's cost of one subproblem with and without the L-BFGS model "
            f"(d = {c['d']:,}, M = {c['M']}, {c['memory']} pairs):\n\n"
            + table(["without model", "with model", "pair update", "compact form", "ratio"],
                    [[ms(c["plain_s"]), ms(c["with_model_s"]), ms(c["pair_update_s"]),
                      ms(c["compact_form_s"]), num(c["ratio"])]]))


def r_second_order_round_cost(d: dict) -> str:
    rc = d["round_cost"]
    s = d["summary"]["round_cost_median_s"]
    rows = [[k, sec(v["total_s"]), sec(v["clients_round_s"]), sec(v["server_s"])]
            for k, v in s.items()]
    return (f"A whole round on full batches of the paper's constrained network ({rc['data']}, "
            f"d = {rc['dim']:,}, U = {rc['U']}, {rc['options']['max_iter']} rounds), medians "
            "over the rounds after the model's memory filled:\n\n"
            + table(["hessian", "round", "clients", "server"], rows)
            + f"\nRatio of the round times, lbfgs over none: "
              f"{num(d['summary']['round_cost_ratio_lbfgs_over_none'])}.\n\n"
            + figure("second_order_round_cost.png", "round cost"))


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def r_nlp(d: dict, png: str) -> str:
    o = d["options"]
    groups = d["counts"]
    outcomes = [k for k in next(iter(groups.values())) if k != "total"]
    rows = [[g] + [c[k] for k in outcomes] + [c["total"]] for g, c in groups.items()]
    cert = [p for p in d["problems"] if p["outcome"] == "certified"]
    rounds = _median([p["library"].get("rounds") for p in cert])
    nit = _median([(p["references"].get("SLSQP") or {}).get("nit") for p in cert])
    nfev = _median([(p["references"].get("SLSQP") or {}).get("nfev") for p in cert])
    # the problems SLSQP solved too (its own success, independent KKT residual <= 1e-6)
    paired = [p for p in cert if (p["references"].get("SLSQP") or {}).get("message")
              == "Optimization terminated successfully"
              and p["references"]["SLSQP"].get("kkt", float("inf")) <= 1e-6]
    p_rounds = _median([p["library"].get("rounds") for p in paired])
    p_nit = _median([p["references"]["SLSQP"].get("nit") for p in paired])
    p_nfev = _median([p["references"]["SLSQP"].get("nfev") for p in paired])
    ratio = _median([p["time_ratio"] for p in cert])
    given = ("Every function carries S2MPJ's exact Hessian (`hess`), so the default "
             "`hessian=\"auto\"` runs the Newton model (d <= 256 on every problem here). "
             if o.get("hessians") else "")
    return (given + f"SSCA's default options (`batch_size=\"full\"`, one client per problem, "
            f"{o['time_limit']:g} s per solve) against SciPy's SLSQP and trust-constr from the "
            "same start. Outcomes: *certified*: status \"converged\" and not false; *FALSE*: "
            "\"converged\" at a point whose gap and independent KKT residual are both large, "
            "or whose violation exceeds 1e-4; *honest*: any other status, with its message; "
            "*exception*: an exception or a killed solve.\n\n"
            + table(["problems"] + outcomes + ["total"], rows)
            + f"\nOn the certified problems: median rounds {num(rounds)} (SLSQP's median "
              f"iterations on them: {num(nit)}"
            + (f", function evaluations: {num(nfev)}" if nfev is not None else "")
            + f"), median wall time {num(ratio)} times SLSQP's. "
            + f"On the {len(paired)} of them that SLSQP solved too (its success and an "
              f"independent KKT residual <= 1e-6): median rounds {num(p_rounds)}, SLSQP's "
              f"median iterations {num(p_nit)}"
            + (f" and function evaluations {num(p_nfev)}" if p_nfev is not None else "")
            + ". A round is one exchange with the clients (values and gradients at one "
              "point, a rejected trial point included); SLSQP's iterations do not count the "
              "trial points of its line search, its function evaluations do.\n\n"
            + figure(png, "gap against time and against the independent KKT residual"))


def r_nlp_hessians(d: dict, png: str, base_stem: str) -> str:
    """:func:`r_nlp` for a run whose functions carry their Hessians, and its rounds against
    the run without them (``base_stem``'s file), problem by problem."""
    out = r_nlp(d, png)
    path = RESULTS / f"{base_stem}.json"
    if not path.exists():
        return out
    base = {p["name"]: p for p in json.loads(path.read_text())["problems"]}
    now = {p["name"]: p for p in d["problems"]}
    common = [n for n in now if n in base]
    both = [n for n in common if now[n]["outcome"] == base[n]["outcome"] == "certified"]
    gained = sorted(n for n in common if now[n]["outcome"] == "certified"
                    and base[n]["outcome"] != "certified")
    lost = sorted(n for n in common if base[n]["outcome"] == "certified"
                  and now[n]["outcome"] != "certified")
    if not both:
        return out
    r0 = [base[n]["library"]["rounds"] for n in both]
    r1 = [now[n]["library"]["rounds"] for n in both]
    geo = statistics.geometric_mean([b / a for a, b in zip(r0, r1)])
    return (out + f"\nAgainst the run without Hessians (`{base_stem}.json`, the same "
            f"problems): certified by both {len(both)}, median rounds {num(_median(r0))} "
            f"without and {num(_median(r1))} with them (geometric mean of the ratios "
            f"{num(geo)}; fewer rounds on {sum(b < a for a, b in zip(r0, r1))}, more on "
            f"{sum(b > a for a, b in zip(r0, r1))}); certified only with them: "
            f"{', '.join(gained) or 'none'}; only without: {', '.join(lost) or 'none'}.\n")


def r_digits_network(d: dict) -> str:
    p, ref = d["problem"], d["reference"]
    rows = [[r["seed"], r["status"], r["rounds"], sec(r["wall_s"]), num(r["norm2"], 6),
             num(r["violation"], 2), f"{r['gap_vs_reference']:+.2%}",
             num(r["stationarity_rel"], 2), "yes" if r.get("target_met") else "no"]
            for r in d["runs"]]
    return (f"min |w|^2 subject to the training loss <= U = {p['U']} on {p['data']} "
            f"(N = {p['N']:,}, {p['network']}, d = {p['d']:,}, {p['clients']} clients), "
            f"default options from {p['x0']}. Reference: {ref['method'].split(',')[0]} on "
            f"the pooled data, |w|^2 = {num(ref['norm2'], 8)}, multiplier "
            f"{num(ref['lam'], 4)}. Target: {p['target']}.\n\n"
            + table(["seed", "status", "rounds", "wall", "|w|^2", "violation",
                     "gap to the reference", "relative stationarity", "target met"], rows)
            + "\n" + figure("digits_network.png", "the runs"))


def r_network_defaults(d: dict) -> str:
    rows = [[r["B"], r["setting"], r["runs"], f"{r['cost_mean']:.4f} ± {r['cost_std']:.4f}",
             f"{r['acc_mean']:.3f}", r["diverged"]] for r in d["table"]]
    return (f"Algorithm 1 on the paper's network ({d['data']}, T = {d['T']} rounds, "
            f"{d['seeds']} seeds) at a fixed B: the default `tau`, `rho`, `gamma` "
            "(`default`) against the tuned Section VI settings (`tuned`), the round-counted "
            "schedules `PowerStep(0.9, 0.4)`, `PowerStep(0.9, 0.55)` with tau = 0.1 "
            "(`previous`) and `EpochStep(0.3, ·)` with tau = 0.1 (`epoch-0.3`). "
            "Diverged: |w|^2 more than 100 times its start.\n\n"
            + table(["B", "setting", "runs", "training cost", "test accuracy", "diverged"], rows)
            + "\n" + figure("network_defaults.png", "training cost per setting"))


def r_engines(d: dict) -> str:
    p = d["problem"]
    rows = []
    for name, e in {**d["round_time"], **d.get("secure_aggregation_round", {})}.items():
        dx = e.get("max_abs_dx_vs_inprocess", e.get("max_abs_dx_vs_plain_inprocess"))
        rows.append([name, e["rounds"], sec(e["median_round_s"]), num(e["ratio_to_inprocess"]),
                     sec(e["startup_s"]), num(dx, 2)])
    return (f"One round of {p['method']} on the {p['network']} (d = {p['d']:,}, "
            f"{p['clients']} clients, B = {p['batch_size']}), one BLAS thread; Flower "
            f"{d.get('flwr', '?')}. {d.get('note', '')}; the ratios are the figure to read.\n\n"
            + table(["engine", "rounds", "median round", "ratio to in-process",
                     "first round's extra", "max |x - x_in-process|"], rows)
            + "\n" + figure("engines.png", "round times"))


def r_participation(d: dict) -> str:
    rows = []
    for r in d["runs"]:
        end = r.get("at_the_end") or {}
        rows.append([r["K"], r["rounds"] if r["reached"] else f"not met in {r['rounds_run']}",
                     num(float(r["floats"])),
                     ", ".join(f"{k} {num(v, 3)}" for k, v in end.items())])
    return (f"Target: {d['target']}.\n\n"
            + table(["K clients per round", "rounds to the target", "floats (up + down)",
                     "at the end"], rows))


def r_threads(d: dict) -> str:
    p = d["problem"]
    rows = [[s["setting"], ms(s["round_median_s"]), sec(s["first_round_s"]),
             num(s["speedup_vs_unlimited_process"])] for s in d["summary"]]
    return (f"A round of the {p['hidden']}-hidden-unit network (d = {p['dim']:,}, "
            f"{p['clients']} clients, B = {p['batch_size']}), median over {p['repeats']} runs "
            f"of {p['rounds']} rounds; load average {d['load_min']:.1f} to {d['load_max']:.1f} "
            "during the run.\n\n"
            + table(["setting", "median round", "first round", "speed-up"], rows)
            + "\n" + figure("threads.png", "round times"))


def r_memory(d: dict) -> str:
    rows = [[r["M"], f"{r['d']:,}", r["clients"], num(r["server_state_before_round_copies_of_d"]),
             num(r["peak_above_before_copies_of_d"]), num(r["after_round_above_before_copies_of_d"]),
             "yes" if r["within_limit"] else "no"] for r in d["round_peak"]]
    out = (f"The server's memory in one round, in {d['unit']} (limit: "
           f"{d['limit_copies_of_d']:g} copies above the state before the round):\n\n"
           + table(["M", "d", "clients", "state before the round", "peak above it",
                    "left after the round", "within the limit"], rows))
    for h in d.get("history_growth", []):
        last = h["rows"][-1]
        per = (last.get("per_round_since_first_mark") or {}).get("rss_bytes")
        out += (f"\nA run of {h['rounds_run']:,} rounds ({'with' if h.get('traced') else 'without'} "
                f"tracemalloc): the history holds {h['history_bytes_per_round_of_arrays']} bytes "
                f"of arrays per round; the resident memory grew {num(per)} bytes per round.\n")
    return out + "\n" + figure("memory.png", "memory per round")


def r_autodiff(d: dict, png: str) -> str:
    torch = any("torch_s" in k for k in d["kernel"])
    rows = []
    for k in d["kernel"]:
        row = [k["B"], ms(k["numba_s"]), ms(k["jax_exact_s"]), num(k["jax_exact_over_numba"]),
               sec(k["jax_exact_first_call_s"])]
        if torch:
            row += [ms(k.get("torch_s")), num(k.get("torch_over_numba"))]
        rows.append(row)
    head = ["B", "Numba kernel", "JAX", "JAX / Numba", "JAX's first call (compile)"]
    if torch:
        head += ["PyTorch", "PyTorch / Numba"]
    out = (f"The paper's network ({'-'.join(map(str, d['network']))}, d = {d['dim']:,}, "
           f"{d['data']}, {d['clients']} clients, {d['threads']} thread): one gradient of a "
           "client's batch by the hand-written Numba kernels and by automatic "
           "differentiation.\n\n" + table(head, rows))
    rows = []
    for s in d["solve"]:
        row = [s["B"], s["T"], ms(s["numba_round_s"]), ms(s["jax_round_s"]),
               num(s["round_jax_over_numba"]), num(s["max_iterate_diff"], 2)]
        if torch:
            row += [ms(s.get("torch_round_s")), num(s.get("round_torch_over_numba"))]
        rows.append(row)
    head = ["B", "rounds", "round, Numba", "round, JAX", "JAX / Numba", "max iterate difference"]
    if torch:
        head += ["round, PyTorch", "PyTorch / Numba"]
    return (out + "\nWhole solves, median round:\n\n" + table(head, rows) + "\n"
            + figure(png, "kernel and round times"))


def r_fault_probe(d: dict) -> str:
    rows = [[k.replace("_", " "), v] for k, v in d["counts"].items()]
    skipped = ", ".join(f"{s['name']} (needs {s['needs']})" for s in d.get("skipped", []))
    return (f"Faults and bad inputs thrown at the public API, each case in a fresh process: "
            f"{len(d['cases'])} cases, {d['met']} met their expectation.\n\n"
            + table(["outcome", "cases"], rows)
            + (f"\nSkipped: {skipped}.\n" if skipped else "")
            + "\n" + figure("fault_probe.png", "the cases"))


def r_rounds(d: dict) -> str:
    head = ("Rounds to a certified answer against the features' condition number, default "
            "options and variants, beside SciPy on the pooled rows (iterations) and the "
            "distance |x - x*| / |x*| to Clarabel's optimum x*. Targets: <= 30 "
            "rounds and a distance <= 1e-3 with the default options, and kkt_tol=1e-8 in <= 50 "
            "rounds.\n\n")
    rows = []
    for r in d["results"]:
        s, sp = r["ssca"], r["scipy"]
        rows.append([f"{r['kappa']:.0e}"]
                    + [f"{s[k]['status']} {s[k]['rounds']} ({num(s[k]['distance'], 2)})"
                       for k in ("default", "full", "lbfgs_full", "tight")]
                    + [f"{sp[k]['iterations']} ({num(sp[k]['distance'], 2)})"
                       for k in ("SLSQP", "trust-constr")]
                    + ["yes" if all(r["targets"].values()) else "no"])
    return (head + table(["condition", "default", "batch full", "L-BFGS, full",
                          "kkt_tol 1e-8", "SLSQP", "trust-constr", "targets met"], rows)
            + "\n" + figure("rounds.png", "rounds and distance against the condition number; "
                                         "a round's time against m")
            + r_rounds_fair(d) + r_rounds_np(d) + r_rounds_multinomial(d)
            + r_rounds_constraints(d))


def r_rounds_multinomial(d: dict) -> str:
    rows = []
    for r in d.get("multinomial") or []:
        s, q = r["ssca"], r.get("slsqp")
        rows.append([r["name"], f"{r['d']:,}", f"{r['N']:,}", f"{s['status']} {s['rounds']}",
                     sec(s["wall"]), q["iterations"] if q else "not run",
                     sec(q["wall"]) if q else "-",
                     num(r["rounds_over_iterations"]) if q else "-",
                     f"{r['relative_objective_vs_slsqp']:.1e}" if q else "-",
                     ("yes" if r["target_met"] else "no") if q else "-"])
    if not rows:
        return ""
    return ("\nMultinomial logistic regression, 10 classes, + 1e-4 |w|^2 s.t. the cross-entropy "
            "on class 8 <= 0.7 of its unconstrained value (active), 5 clients, the default "
            "options (full batches, the L-BFGS model above d = 256), beside SciPy's SLSQP on "
            "the pooled rows (exact gradients, ftol 1e-12). Target: rounds <= 2x SLSQP's iterations.\n\n"
            + table(["data", "d", "rows", "SSCA", "wall", "SLSQP iterations", "SLSQP wall",
                     "rounds / iterations", "objective vs SLSQP", "target met"], rows))


def r_rounds_constraints(d: dict) -> str:
    recs = d.get("constraints") or []
    vector = bool(recs) and all("ssca_vector" in r for r in recs)
    growth = bool(recs) and all("growth" in r for r in recs)
    calls = vector and all("user_calls_per_round" in r[k] for r in recs
                           for k in ("ssca", "ssca_vector"))
    rows = [[r.get("n", 300), r["m"], r["active"], f"{r['ssca']['status']} {r['ssca']['rounds']}",
             ms(r["ssca"]["round_s"])]
            + ([ms(r["ssca_vector"]["round_s"])] if vector else [])
            + [r["slsqp"]["iterations"], ms(r["slsqp"]["iteration_s"]),
               num(r["round_over_iteration"])]
            + ([" / ".join(num(r["growth"][k]) for k in ("ssca", "ssca_vector", "slsqp"))]
               if growth else [])
            + ([" / ".join(f"{r[k]['user_calls_per_round']:.0f}"
                           for k in ("ssca", "ssca_vector"))] if calls else [])
            for r in recs]
    if not rows:
        return ""
    head = (["n", "m", "active at the optimum", "SSCA", "a round"]
            + (["a round, one vector function"] if vector else [])
            + ["SLSQP iterations", "an iteration", "round / iteration"]
            + (["growth since the smallest m (round / vector round / iteration)"]
               if growth else [])
            + (["calls of the user's functions a round (separate / vector)"]
               if calls else []))
    return ("\nA round's cost against the number of constraints m: min |w|^2 / 2 + c.w s.t. "
            "(a_m.w)^2 <= b_m, each constraint its own function, one client, the default "
            "options (at n = 9 the Newton model, its Hessians differenced by the client; at "
            "n = 300 the quasi-Newton model), beside an SLSQP iteration on the same problem "
            "(the constraints as one vector function); each wall time the fastest of 5 runs "
            "in each of two passes over the sizes."
            + (" \"One vector function\": the same constraints as one "
               "`VectorSampleFunction` (one call of the user's function per round instead of "
               "m, and the clients' statistics of all m components at once)." if vector else "")
            + (" The calls of the user's functions a round are counted in a solve of their own:"
               " with one function per constraint they grow with m (the Newton model's Hessians"
               " are differenced, 2n gradient calls for each function whose curvature the "
               "round asks for), with one vector function they do not." if calls else "")
            + " Target: a round within 5x an iteration at n = m = 300, and nearly flat in m.\n\n"
            + table(head, rows) + r_rounds_constraints_flower(d))


def r_rounds_constraints_flower(d: dict) -> str:
    fl = d.get("constraints_flower") or {}
    if "skipped" in fl:
        return f"\n\nOver Flower's simulation engine: skipped ({fl['skipped']})."
    recs = fl.get("results") or []
    if not recs:
        return ""
    rows = [[r["n"], r["m"], "one function per constraint" if r["form"] == "separate"
             else "one vector function", f"{r['status']} {r['rounds']}", ms(r["round_s"]),
             num(r["growth"])] for r in recs]
    return ("\n\nThe same round on a federated transport: Flower's simulation engine (the "
            "client in a Ray actor, every request and reply a Flower message), one solve "
            "each, the median time between successive rounds (the engine's start-up not in "
            "it).\n\n"
            + table(["n", "m", "constraints as", "SSCA", "a round", "growth since m = "
                     f"{recs[0]['m']}"], rows))


def r_rounds_fair(d: dict) -> str:
    f = d.get("fair_logistic")
    if not f:
        return ""
    rows = [[k, s["status"], s["rounds"], sec(s["wall"]), f"{s['floats_up']:,}"]
            for k, s in f["ssca"].items()]
    return (f"\nWhere a full pass is cheap: fairness-constrained logistic regression on "
            f"synthetic rows, N = {f['n']:,}, d = {f['d']}, {f['clients']} clients, the parity "
            f"gap within {f['eps']}. The default's rounds over `batch_size=\"full\"`'s: "
            f"{num(f['default_over_full_rounds'])} (target: <= 1.5).\n\n"
            + table(["batch_size", "status", "rounds", "wall", "floats up"], rows))


def r_rounds_np(d: dict) -> str:
    rows = [[f"{r['Nd']:.0e}", r["ssca"]["status"], r["ssca"]["rounds"], sec(r["ssca"]["wall"]),
             r["slsqp"]["nit"], sec(r["slsqp"]["wall"]), num(r["wall_over_slsqp"]),
             f"{r['relative_objective_vs_slsqp']:.1e}", "yes" if r["target_met"] else "no"]
            for r in d.get("neyman_pearson_pooled") or []]
    if not rows:
        return ""
    return ("\nNeyman-Pearson logistic regression on synthetic rows (d = 20, 10 clients), "
            "the default options against SciPy's SLSQP on the pooled rows. Targets: <= 30 "
            "rounds and <= 2x SLSQP's wall time. The objective's difference is relative to "
            "SLSQP's (negative: the certified point's violation, within feas_tol, lets it "
            "below).\n\n"
            + table(["N d", "status", "rounds", "wall", "SLSQP iterations", "SLSQP wall",
                     "wall / SLSQP", "objective vs SLSQP", "targets met"], rows))


def r_batch_cost(d: dict) -> str:
    head = (f"What `batch_size=\"auto\"` decides from: the same problem (least squares, "
            f"d = {d['d']}, {d['clients']} clients, condition number {d['cond']:g}) at growing "
            f"work of a client's full pass (its rows times d), solved with `\"full\"`, "
            f"`\"grow\"` and `\"auto\"` (the other options at their defaults) on each "
            f"transport. `\"auto\"` reads every row from round 1 up to "
            f"{d['full_pass_work']:,} row-parameters (2^24) and grows the batch above.\n\n")
    rows = [[f"2^{r['log2_work']}", r["transport"], r["rows_per_client"],
             f"{r['full']['rounds']} / {sec(r['full']['wall'])}",
             f"{r['grow']['rounds']} / {sec(r['grow']['wall'])}",
             f"{r['auto']['rounds']} / {sec(r['auto']['wall'])}", num(r["full_over_grow"])]
            for r in d["rows"]]
    fixed = [[t, ms(v["round_fixed_s"]), f"{v['full_pass_s_per_row_parameter']:.3g}",
              f"{v['work_at_which_the_pass_equals_the_fixed_part']:,.0f}"
              if v["work_at_which_the_pass_equals_the_fixed_part"] else "-"]
             for t, v in d["per_transport"].items()]
    return (head + table(["rows x d", "transport", "rows per client", "full: rounds / wall",
                          "grow: rounds / wall", "auto: rounds / wall", "full / grow wall"],
                         rows)
            + "\nPer transport: a round's fixed part (the median full-batch round at the "
              "smallest work) and a full pass's time per row-parameter (from the largest).\n\n"
            + table(["transport", "fixed part of a round", "s per row-parameter",
                     "rows x d where the pass equals the fixed part"], fixed)
            + "\nHow to read it: full batches took less wall time than the growing schedule at "
              "every work level measured, on both transports, although from a few hundred "
              "thousand row-parameters on a full pass costs more than a round's fixed part: "
              "the growing schedule reaches full batches anyway and spends many more rounds "
              "on the way. The threshold is therefore no crossover of this family; it is where "
              "`\"auto\"` stops assuming that a full pass is affordable. Above it the growing "
              "schedule stays for models whose useful progress comes in sampled rounds (the "
              "paper's network reads about 6e8 row-parameters per client and round); where a "
              "full pass is affordable above it, `batch_size=\"full\"` is the faster choice "
              "on a problem like this one.\n\n"
            + figure("batch_cost.png", "full over grow, and rounds, against the work"))


def r_many_clients(d: dict) -> str:
    shards = d.get("shards", "?")
    rows = []
    for r in d.get("results", []):
        sh = r.get("sharded")
        rows.append([f"{r['clients']:,}", ms(r["numpy_round_s"]), ms(r["library"]["round_s"]),
                     num(r.get("ratio_one_by_one", r.get("ratio"))),
                     ms(sh["round_s"]) if sh else "not run",
                     num(r["ratio"]) if sh else "",
                     "; ".join(f"{k}: {ms(v)}" for k, v in
                               r.get("other_shards_round_s", {}).items())])
    out = ("A full-batch round of Neyman-Pearson logistic regression (N = 100,000 synthetic "
           "rows, d = 30, `hessian=\"lbfgs\"`, both class losses from one pass over the rows, "
           "in process) against a batched NumPy round that computes the same per-client "
           "values, gradients and statistics in one pass over the rows (sparse per-client "
           "sums), each client answering for itself and with the clients in "
           f"`shards={shards}`. Targets (issue \"thousands of clients\"): round / NumPy "
           "round <= 1.5 at I = 1,000 and <= 2 at I = 10,000.\n\n"
           + table(["clients I", "NumPy round", "each client answers", "ratio",
                    f"shards={shards}", "ratio", "other shards"], rows))
    eng = d.get("engines") or []
    if eng:
        erows = [[e["engine"], f"{e['clients']:,}",
                  ms(e["round_s"]) if "round_s" in e else e.get("error", "")[:90],
                  num(e["ratio_to_in_process"]) if e.get("ratio_to_in_process") else "",
                  f"{e['total_s']:.0f} s"] for e in eng]
        run = d.get("engines_run") or {}
        again = (f" (measured again by `python {run['command']}` on {machine_of(run)})"
                 if run.get("command") else "")
        out += ("\n\nOther engines, the same round (median), against the in-process shards' "
                f"round at the same I{again} (target for 2 workers at I = 10,000: within "
                "2x):\n\n"
                + table(["engine", "clients I", "round", "/ in process", "run in all"], erows))
    net = d.get("network") or {}
    if net and "skipped" not in net:
        nrows = [[k, ms(v["round_s"]), f"{v['training_cost']:.4f}",
                  f"{v['test_accuracy']:.4f}", f"{v['wall_s']:.0f} s"]
                 for k, v in net.items() if isinstance(v, dict)]
        out += (f"\n\nThe paper's network (784-128-10, Fashion-MNIST) over "
                f"{net['clients']:,} clients, {net['clients_per_round']} a round, B = "
                f"{net['batch_size']}, {net['rounds']} rounds of Algorithm 1 (final points "
                f"differ by {net['x_difference']:.1e}):\n\n"
                + table(["clients", "round", "training cost", "test accuracy", "run"], nrows))
    big = d.get("hundred_thousand_clients") or {}
    if "peak_rss_bytes" in big:
        out += (f"\n\n{big['clients']:,} clients of {big['rows_per_client']} rows (N = "
                f"{big['N']:,}, d = {big['d']}), {big['rounds']} rounds of Algorithm 2 "
                f"(B = {big['batch_size']}, shards={big['shards']}): peak memory "
                f"{big['peak_rss_bytes'] / 2 ** 20:.0f} MiB (the rows: "
                f"{big['rows_bytes'] / 2 ** 20:.0f} MiB), median round {big['round_s']:.2f} s, "
                f"{big['wall_s']:.0f} s in all, status {big['status']}.")
    return out + "\n\n" + figure("many_clients.png", "a round against the number of clients")


def r_sketch(d: dict) -> str:
    def cell(rec):
        if not rec:
            return "not run"
        err = rec.get("relative_error")
        return (f"{rec['status']}, {rec['rounds']} rounds, {rec['wall']:.1f} s, "
                f"{rec['floats_up'] / 1e6:.1f}M floats"
                + (f", error {err:.1e}" if err is not None else ""))

    rows = [[r["name"], str(r["k"]), cell(r["sketch"]), cell(r["lbfgs"]), cell(r.get("newton")),
             num(r["rounds_sketch_over_lbfgs"])] for r in d.get("results", [])]
    return ("`hessian=\"sketch\"` (k directions' Hessian products a round, a randomized "
            "Nystrom model) against `\"lbfgs\"` (what `\"auto\"` picks above d = 256) and "
            "the whole Hessians (`\"newton\"`, where d allows), full batches, 5 clients, one "
            "run (`benchmarks/sketch.py`). Error: |x - x*| / |x*| against the pooled "
            "optimum.\n\n"
            + table(["problem", "k", "sketch", "lbfgs", "newton", "rounds sketch / lbfgs"],
                    rows) + "\n\n"
            + figure("sketch.png", "rounds and floats with each model of the Hessian"))


def r_privacy(d: dict) -> str:
    def plural(n, word):
        return f"{n} {word}" + ("" if n == 1 else "s")

    def spent(r):
        e = r.get("epsilon_spent")
        if r["setting"] == "clip only":
            return "—"           # the negligible noise's epsilon is astronomical
        return num(e) if e is not None else "—"

    def rng(r, key, digits):
        lo, hi = r[key + "_range"]
        return f"{r[key]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    def distributed(part, metrics, intro, sep=" ("):
        """The distributed mechanism's table of ``part`` (medians of ``metrics``: key -> column
        title), after ``intro`` and the run's command, date and commit."""
        dist = part.get("distributed") or {}
        if not dist.get("medians"):
            return ""
        rows = [[r["setting"], *(rng(r, k, 4) for k in metrics), num(r["noise_multiplier"]),
                 spent(r), sec(r["wall_s"])] for r in dist["medians"]]
        return (f"\n{intro}{sep}`{dist['command']}`, {dist['date']}, commit "
                f"`{dist['library']['commit'][:7]}`):\n\n"
                + table(["epsilon", *metrics.values(), "z", "epsilon spent", "run"], rows))

    out = ("Record-level (epsilon, delta)-differential privacy of method `\"ssca\"` "
           "(`privacy=ss.Privacy(epsilon, delta, clip)`, the Gaussian mechanism of "
           "[privacy](privacy.md#differential-privacy)), `benchmarks/privacy.py`. The noise "
           "is calibrated by the accountant to the T rounds asked for. `inf`: the same "
           "solve without privacy (same B, tau, T and seeds; under privacy the batches come "
           "from the mechanism's fresh entropy, so the comparison is between distributions); "
           "`clip only`: the rows clipped to C as under privacy, the noise negligible: the "
           "clipping's bias alone. The solver evaluates nothing under privacy: every point "
           "is evaluated by the benchmark on the pooled training rows and on held-out rows. "
           "Medians over the seeds, with their range in brackets; z is the noise "
           "multiplier (the noise's standard deviation over C times the largest client "
           "weight). C was picked by a pilot at one epsilon on other seeds, reading the "
           "training data without privacy: that choice is not privatised.\n")
    npart = d.get("neyman_pearson") or {}
    if npart.get("medians"):
        s, ref, pil = npart["setup"], npart["reference"], npart["pilot"]
        rows = [[r["setting"], rng(r, "objective", 4), rng(r, "violation", 4),
                 rng(r, "test_accuracy", 4), num(r["noise_multiplier"]), spent(r),
                 num(r["clipped_fraction"]), sec(r["wall_s"])] for r in npart["medians"]]
        out += (f"\n**Neyman-Pearson** (alpha = {s['alpha']}, lambda = {s['lam']}) on "
                f"{s['N_train']:,} synthetic training rows (d = {s['d']}, {s['clients']} "
                f"clients; {s['N_test']:,} held out), B = {s['B']}, tau = {s['tau']}, T = "
                f"{s['T']}, {plural(len(s['seeds']), 'seed')}, delta = {s['delta']:g}, C = "
                f"{num(npart['clip'])}; the class fractions are {s['class_fractions_note']}. "
                f"The non-private optimum (`prob.solve(method=\"ssca\")`, {ref['status']} in "
                f"{ref['rounds']} rounds): objective {ref['objective']:.4f}, violation "
                f"{ref['violation']:.1e}, test accuracy {ref['test_accuracy']:.4f}. Pilot at "
                f"epsilon = {num(pil['epsilon'])}, {plural(len(pil['seeds']), 'seed')} "
                f"({', '.join(map(str, pil['seeds']))}), criterion: {pil['criterion']}: "
                + ", ".join(f"C = {c}: {v:.4f}" for c, v in pil["median_merit_by_clip"].items())
                + ".\n\n"
                + table(["epsilon", "objective", "violation", "test accuracy", "z",
                         "epsilon spent", "fraction of rows clipped at the end", "run"], rows))
        out += distributed(npart, {"objective": "objective", "violation": "violation",
                                    "test_accuracy": "test accuracy"},
                           "The **distributed** mechanism (`Privacy(mechanism=\"distributed\")` "
                           "with `secure_aggregation=True`: each client adds its share of the "
                           "noise as discrete Gaussian integers before the masks, and the "
                           "server never holds an un-noised sum) at the same C, epsilons and "
                           "seeds")
    net = d.get("network") or {}
    if net.get("medians"):
        s, pil = net["setup"], net["pilot"]
        rows = [[r["setting"], rng(r, "train_cost", 4), rng(r, "test_accuracy", 4),
                 num(r["noise_multiplier"]), spent(r), num(r["clipped_fraction"]),
                 sec(r["wall_s"])] for r in net["medians"]]
        out += (f"\n**The paper's network** ({s['net']}, {s['data']}, {s['clients']} "
                f"clients, lambda = {s['lam']}), B = {s['B']}, tau = {s['tau']}, T = "
                f"{s['T']}, {plural(len(s['seeds']), 'seed')}, C = {num(net['clip'])}; its "
                "SampleFunction has no `per_sample_grad`, so under privacy every client "
                "calls `grad` on each row alone (compare the run times). Rows clipped: on "
                f"{s['clipped_fraction_rows']:,} training rows at the returned point. Pilot at "
                f"epsilon = {num(pil['epsilon'])}, {plural(len(pil['seeds']), 'seed')} "
                f"({', '.join(map(str, pil['seeds']))}), criterion: {pil['criterion']}: "
                + ", ".join(f"C = {c}: {v:.4f}" for c, v in pil["median_cost_by_clip"].items())
                + ".\n\n"
                + table(["epsilon", "training cost", "test accuracy", "z", "epsilon spent",
                         "fraction of rows clipped at the end", "run"], rows))
        seeds = (net.get("distributed") or {}).get("seeds", [])
        out += distributed(net, {"train_cost": "training cost", "test_accuracy": "test accuracy"},
                           "The **distributed** mechanism on the network, at the same C and "
                           f"epsilons, {plural(len(seeds), 'seed')} "
                           f"({', '.join(map(str, seeds))}", sep="; ")
    elif net.get("skipped"):
        out += f"\nThe network was not run: {net['skipped']}.\n"
    return out + "\n" + figure("privacy.png", "utility against epsilon, both problems")


def r_generic(d: dict) -> str:
    scalars = {k: v for k, v in d.items() if isinstance(v, (int, float, str))
               and k not in ("command", "date", "commit")}
    return table(["field", "value"], [[k, num(v) if not isinstance(v, str) else v[:80]]
                                      for k, v in scalars.items()])


#: (file stem, section title, renderer), in the page's order; a title of None continues the
#: previous section
SECTIONS = [
    ("section_vi", "The paper's Section VI on Fashion-MNIST", r_section_vi),
    ("section_vi_long", None, r_section_vi_long),
    ("defaults", "Default options on a suite of problems with known answers", r_defaults),
    ("ablation", None, r_ablation),
    ("constrained", "Constrained baselines: Algorithm 2 against primal-dual and augmented "
                    "Lagrangian", lambda d: r_constrained(d, "constrained.png")),
    ("constrained_network", None, lambda d: r_constrained(d, "constrained_network.png")),
    ("rounds", "Rounds against conditioning: the Newton model", r_rounds),
    ("sketch", "The Hessian's sketch", r_sketch),
    ("batch_cost", "Batches chosen by cost: full passes where they are cheap", r_batch_cost),
    ("second_order", "The second-order phase (hessian)", r_second_order),
    ("second_order_cost", None, r_second_order_cost),
    ("second_order_round_cost", None, r_second_order_round_cost),
    ("nlp_collection", "A public collection: S2MPJ's constrained problems",
     lambda d: r_nlp(d, "nlp_collection.png")),
    ("nlp_collection_held_out", None, lambda d: r_nlp(d, "nlp_collection_held_out.png")),
    ("nlp_collection_hessians", None,
     lambda d: r_nlp_hessians(d, "nlp_collection_hessians.png", "nlp_collection")),
    ("nlp_collection_held_out_hessians", None,
     lambda d: r_nlp_hessians(d, "nlp_collection_held_out_hessians.png",
                              "nlp_collection_held_out")),
    ("digits_network", "A constrained network: the digits data", r_digits_network),
    ("network_defaults", "The paper's network at a fixed batch size: default step sizes",
     r_network_defaults),
    ("section_v", "The closed form against CVXPY, and a round at the paper's scale",
     r_section_v),
    ("engines", "Engines: what a round costs on each transport", r_engines),
    ("many_clients", "Many clients: a round against a batched NumPy round", r_many_clients),
    ("engines_network_participation", None, r_participation),
    ("engines_np_participation", None, r_participation),
    ("privacy", "Differential privacy: utility against epsilon", r_privacy),
    ("threads", "Threads in client processes", r_threads),
    ("memory", "Memory", r_memory),
    ("autodiff", "Automatic differentiation against hand-written kernels",
     lambda d: r_autodiff(d, "autodiff.png")),
    ("autodiff_quick", None, lambda d: r_autodiff(d, "autodiff_quick.png")),
    ("fault_probe", "Faults and bad inputs", r_fault_probe),
]

SUBTITLES = {
    "section_vi_long": "The longer run",
    "ablation": "Which mechanism of the defaults earns its place",
    "constrained_network": "The paper's constrained network",
    "second_order_cost": "The model's cost on the server",
    "second_order_round_cost": "The model's cost in a whole round",
    "nlp_collection_held_out": "The HS family, held out",
    "nlp_collection_hessians": "With the functions' Hessians (the Newton model)",
    "nlp_collection_held_out_hessians": "The HS family with the functions' Hessians",
    "engines_network_participation": "Partial participation: the paper's network",
    "engines_np_participation": "Partial participation: Neyman-Pearson",
    "autodiff_quick": "The small network, with PyTorch",
}


def page() -> str:
    files = {p.stem: p for p in sorted(RESULTS.glob("*.json"))}
    data = {stem: json.loads(p.read_text()) for stem, p in files.items()}
    known = [s for s, _, _ in SECTIONS if s in data]
    extra = [s for s in data if s not in {x for x, _, _ in SECTIONS}]
    prov = {s: provenance(files[s], data[s]) for s in known + extra}

    out = ["# Benchmarks: measured figures\n",
           "<!-- Generated by benchmarks/make_page.py from benchmarks/results/*.json: edit "
           "that script, not this page. -->\n",
           "Every figure on this page is read from a result file in `benchmarks/results/` by "
           "`python benchmarks/make_page.py`, which writes this page. A benchmark is a program "
           "in `benchmarks/`: run it with `--publish` to replace its result file (without, it "
           "writes to `benchmarks/results_local/`, which git ignores), then run "
           "`make_page.py`. Times depend on the machine and its load: the machines were "
           "2-core virtual machines shared with other jobs, so read the ratios rather than "
           "the absolute times. Some benchmarks need data that is not shipped: "
           "Fashion-MNIST (the Debian package `dataset-fashion-mnist`) and S2MPJ "
           "(`git clone https://github.com/GrattonToint/S2MPJ`).\n",
           "## Where and when\n",
           "The library commit the run recorded, or else the commit that published the "
           "result.\n"]
    rows = [[f"`{s}.json`", f"`{prov[s]['command']}`", f"`{prov[s]['commit']}`",
             prov[s]["date"], prov[s]["machine"], sec(prov[s]["wall"])]
            for s in known + extra]
    out.append(table(["result", "command", "commit", "date", "machine", "run time"], rows))
    for stem, title, render in SECTIONS:
        if stem not in data:
            continue
        if title:
            out.append(f"## {title}\n")
        else:
            out.append(f"### {SUBTITLES.get(stem, stem)}\n")
        out.append(f"From `benchmarks/results/{stem}.json`.\n")
        out.append(render(data[stem]))
    if extra:
        out.append("## Other results\n")
        for stem in extra:
            out.append(f"### `{stem}`\n")
            out.append(r_generic(data[stem]))
    return "\n".join(s.rstrip("\n") + "\n" for s in out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when docs/benchmarks.md differs from what would be written")
    args = ap.parse_args(argv)
    text = page()
    if args.check:
        same = PAGE.exists() and PAGE.read_text() == text
        print("docs/benchmarks.md is " + ("up to date" if same else "out of date: run "
                                          "python benchmarks/make_page.py"))
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
