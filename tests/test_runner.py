"""The one runner: stateless clients, callbacks that stop, statuses, checkpoint and resume."""

import gc

import numpy as np
import pytest

import ssca_solver as ss
from conftest import round_request, ssca_clients
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson
from ssca_solver.federated import InProcessTransport, Reply, Request


# -- stateless clients ------------------------------------------------------------------------

def test_a_request_gets_the_same_reply_from_two_freshly_built_clients(cancer_data):
    """A client's batch at round t is a pure function of (seed, client, round): an engine that
    builds a new client per message answers exactly as a long-lived one."""
    prob = neyman_pearson(cancer_data, alpha=0.2)
    w = np.full(prob.dim, 0.05)
    long_lived = ssca_clients(prob, seed=3)
    for t in (1, 2, 3):                       # earlier rounds must not change round 3's batch
        long_lived[2].handle(round_request(t, w, 7).read_only())
    a = long_lived[2].handle(round_request(3, w, 7).read_only())
    b = ssca_clients(prob, seed=3)[2].handle(round_request(3, w, 7).read_only())
    c = ssca_clients(prob, seed=3)[2].handle(round_request(4, w, 7).read_only())
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k])
    assert not np.array_equal(a.arrays["0:lin"], c.arrays["0:lin"])   # another round, batch


@pytest.mark.parametrize("seed", [5, [5], np.random.SeedSequence(5)])
def test_seeds_are_whatever_default_rng_accepts(cancer_data, seed):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    ref = prob.solve(batch_size=5, max_iter=3, seed=5, eval_every=None)
    res = prob.solve(batch_size=5, max_iter=3, seed=seed, eval_every=None)
    if isinstance(seed, list):      # another seed: another stream, but valid
        assert res.nit == 3
    else:
        np.testing.assert_array_equal(res.x, ref.x)
    gen = prob.solve(batch_size=5, max_iter=3, seed=np.random.default_rng(1), eval_every=None)
    assert gen.nit == 3
    with pytest.raises(ValueError, match="seed must be"):
        prob.solve(batch_size=5, max_iter=3, seed=-1)
    with pytest.raises(ValueError, match="seed must be"):
        prob.solve(batch_size=5, max_iter=3, seed=True)


# -- callbacks and statuses -------------------------------------------------------------------

@pytest.mark.parametrize("how", ["true", "stopiteration"])
def test_callback_stops_the_run(cancer_data, how):
    seen = []

    def cb(it):
        seen.append((it.t, it.method, it.stage, it.penalty))
        assert not it.x.flags.writeable
        if it.t == 4:
            if how == "true":
                return True
            raise StopIteration

    res = neyman_pearson(cancer_data, 0.2).solve(batch_size=5, max_iter=50, penalty=[10.0],
                                                 seed=0, eval_every=2, callback=cb)
    assert res.status == "stopped" and not res.success and res.nit == 4
    assert "stopped by the callback after round 4" in res.message
    assert seen == [(t, "ssca", 0, 10.0) for t in range(1, 5)]
    assert len(res.history.t) == 4 and list(res.history.eval_t) == [0, 2, 4]


def test_callback_sees_the_latest_evaluation(cancer_data):
    got = []
    neyman_pearson(cancer_data, 0.2).solve(
        batch_size=5, max_iter=6, penalty=[10.0], seed=0, eval_every=3,
        callback=lambda it: got.append((it.t, it.eval_t, it.objective, it.constraints)))
    # (round 0: the start point's evaluation, the latest until round 3's)
    assert [g[1] for g in got] == [0, 0, 3, 3, 3, 6]
    assert got[2][2] is not None and got[2][3].shape == (1,)


def test_success_only_when_the_stopping_test_passed(cancer_data):
    """Algorithm 1 and FedAvg have no stopping test of their own: max_iter is not success."""
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    one = prob.solve(batch_size=1, max_iter=1, seed=0, eval_every=None)
    assert one.status == "max_iter" and not one.success
    fed = prob.solve(method="fedavg", batch_size=5, max_iter=3, seed=0, eval_every=None)
    assert fed.status == "max_iter" and not fed.success and fed.method == "fedavg"
    con = neyman_pearson(cancer_data, 0.2).solve(seed=0)
    assert con.status == "converged" and con.success
    assert con.kkt.passed(1e-4, 1e-4)
    fixed = neyman_pearson(cancer_data, 0.2).solve(batch_size=50, max_iter=200,
                                                   penalty=[10.0, 100.0], seed=0,
                                                   eval_every=None)
    assert fixed.status == "max_iter" and not fixed.success      # no test ran


def test_penalty_is_the_c_of_the_stage_that_stopped(cancer_data):
    res = neyman_pearson(cancer_data, alpha=0.2).solve(penalty=[10.0, 100.0, 1000.0], seed=0)
    # c = 10 is exact (mu* = 0.13): the slack vanishes and every stage keeps c = 10
    assert res.status == "converged" and res.penalty == 10.0
    assert {s.penalty for s in res.stages} == {10.0}
    # mu* = 0.74 at alpha = 0.1: the slack stays positive at c = 0.1 and 0.3
    stopped = neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size=50, max_iter=60, penalty=[0.1, 0.3, 10.0], seed=0,
        eval_every=None, callback=lambda it: it.t == 25)
    assert stopped.status == "stopped" and stopped.penalty == 0.3
    assert [s.penalty for s in stopped.stages] == [0.1, 0.3]
    assert [s.rounds for s in stopped.stages] == [20, 5]


# -- checkpoint and resume -------------------------------------------------------------------

def _runs(prob, stop_at, path, **opts):
    """(uninterrupted result, result resumed from a checkpoint written when the callback
    stopped the first run at round ``stop_at``)."""
    full = prob.solve(**opts)
    first = prob.solve(checkpoint=path, checkpoint_every=3, callback=lambda it: it.t == stop_at,
                       **opts)
    assert first.status == "stopped" and first.nit == stop_at
    resumed = prob.solve(resume=path, **{k: v for k, v in opts.items() if k != "seed"})
    return full, resumed


@pytest.mark.parametrize("budget", [None, 0.5])
@pytest.mark.parametrize("stop_at", [7, 30, 45])
def test_resume_gives_the_iterates_of_an_uninterrupted_run(cancer_data, tmp_path, stop_at,
                                                           budget):
    """Algorithm 2 with the continuation: stopped inside stage 1 (7), at its last round (30),
    inside stage 2 (45); resumed, every iterate and record equals the uninterrupted run's.
    With an evaluations' budget too: the rows read since the last paid evaluation are kept
    in the checkpoint (they were not: the resumed run evaluated at round 72, the
    uninterrupted one at 68)."""
    prob = neyman_pearson(cancer_data, alpha=0.1)
    opts = dict(batch_size=10, max_iter=90, penalty=[0.1, 10.0, 100.0], seed=11, eval_every=4,
                eval_budget=budget)
    full, res = _runs(prob, stop_at, tmp_path / "run.ckpt", **opts)
    assert res.nit == full.nit and res.status == full.status
    np.testing.assert_allclose(res.x, full.x, rtol=1e-12, atol=1e-12)
    for name in full.history.names:
        np.testing.assert_allclose(getattr(res.history, name), getattr(full.history, name),
                                   rtol=1e-12, atol=1e-12, err_msg=name)
    assert res.stages == full.stages and res.penalty == full.penalty
    assert res.communication == full.communication
    assert res.kkt.stationarity == pytest.approx(full.kkt.stationarity, rel=1e-10)


@pytest.mark.parametrize("method, extra", [
    ("ssca", dict(subproblem="cvxpy")),
    ("fedavg", dict(momentum=0.5, local_steps=2)),
])
def test_resume_other_paths(cancer_data, tmp_path, method, extra):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data,
                      regularizer=lambda w: 1e-2 * ss_sum_squares(w))
    opts = dict(method=method, batch_size=10, max_iter=12, seed=2, eval_every=5, **extra)
    full, res = _runs(prob, 5, tmp_path / "ck.npz", **opts)
    np.testing.assert_allclose(res.x, full.x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.history.objective, full.history.objective, rtol=1e-12)


def ss_sum_squares(w):
    import cvxpy as cp

    return cp.sum_squares(w)


def test_checkpoint_is_plain_numpy_and_resume_checks_what_must_match(cancer_data, tmp_path):
    prob = neyman_pearson(cancer_data, alpha=0.2)
    path = tmp_path / "ck"
    opts = dict(batch_size=10, max_iter=6, penalty=[10.0], seed=1, eval_every=None)
    prob.solve(checkpoint=path, checkpoint_every=2, **opts)
    with np.load(path, allow_pickle=False) as f:        # no pickled objects inside
        assert "state/w" in f.files and "history/t" in f.files
        assert int(f["state/t"]) == 6
    with pytest.raises(ValueError, match="batch_size"):
        prob.solve(resume=path, **{**opts, "batch_size": 20})
    with pytest.raises(ValueError, match="gamma"):
        prob.solve(resume=path, **{**opts, "gamma": ss.PowerStep(0.5, 0.6)})
    with pytest.raises(ValueError, match="another seed"):
        prob.solve(resume=path, **{**opts, "seed": 2})
    # the schedules are checked as resolved: "auto" and the default it stands for are the
    # same steps; a checkpoint of other steps (e.g. an earlier version's defaults) is refused
    sampled = {"rho": ss.EpochStep(0.15, 0.4), "gamma": ss.EpochStep(0.3, 0.55)}
    assert prob.solve(resume=path, **{**opts, **sampled}).nit == 6
    with pytest.raises(ValueError, match=r"written with rho = 'EpochStep\(a=0\.3"):
        prob.solve(checkpoint=path, **{**opts, "rho": ss.EpochStep(0.3, 0.4)})
        prob.solve(resume=path, **opts)
    with pytest.raises(ValueError, match="constraints"):
        ss.Problem(logistic_loss(), dim=31, data=cancer_data).solve(
            resume=path, batch_size=10, max_iter=6, eval_every=None)
    plain, fed = ss.Problem(logistic_loss(), dim=31, data=cancer_data), tmp_path / "fed"
    plain.solve(method="fedavg", batch_size=10, max_iter=2, checkpoint=fed, eval_every=None)
    with pytest.raises(ValueError, match="method = 'fedavg'"):
        plain.solve(resume=fed, batch_size=10, max_iter=2, eval_every=None)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        prob.solve(resume=tmp_path / "missing", **opts)
    (tmp_path / "junk").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a checkpoint"):
        prob.solve(resume=tmp_path / "junk", **opts)


def test_a_failing_round_carries_the_last_good_state_and_checkpoint(cancer_data, tmp_path):
    good = logistic_loss()
    state = {"fail": False}

    def value(w, X, y):
        if state["fail"]:
            raise RuntimeError("disk on fire")
        return good.value(w, X, y)

    f = ss.SampleFunction(value, good.grad, name="flaky")
    prob = ss.Problem(f, dim=31, data=cancer_data)
    path = tmp_path / "ck.npz"

    def cb(it):
        state["fail"] = it.t == 4

    with pytest.raises(ss.UserFunctionError, match="disk on fire") as info:
        prob.solve(batch_size=5, max_iter=10, seed=0, eval_every=None, callback=cb,
                   checkpoint=path)
    assert info.value.state.t == 4 and info.value.checkpoint == str(path)
    state["fail"] = False
    res = prob.solve(batch_size=5, max_iter=10, eval_every=None, resume=info.value.checkpoint)
    ref = prob.solve(batch_size=5, max_iter=10, seed=0, eval_every=None)
    np.testing.assert_array_equal(res.x, ref.x)


# -- state in the state ----------------------------------------------------------------------

def test_problem_reads_surrogates_when_it_solves(cancer_data):
    f = logistic_loss()
    prob = ss.Problem(f, dim=31, data=cancer_data)
    assert prob.solve(batch_size=5, max_iter=2, eval_every=None).subproblem == "closed_form"
    f.surrogate = ss.DiagonalCurvature(logistic_loss().hess_diag)
    assert prob.solve(batch_size=5, max_iter=2, eval_every=None).subproblem == "cvxpy"


def test_subproblem_solvers_hold_no_state_between_rounds(cancer_data):
    from ssca_solver.subproblems import make_subproblem

    prob = neyman_pearson(cancer_data, 0.2)
    for kind in ("closed_form", "cvxpy"):
        sub = make_subproblem(prob, prob.builders, kind)
        stats = [b.initial_statistics(prob.dim, 0.1, "tau") for b in prob.builders]
        # a first round may build what the solver compiles once (CVXPY's problem in w is
        # built on first use); from then on a round changes nothing the solver holds
        sub.solve(stats, 10.0, round=1, nu0=np.zeros(1))
        before = dict(vars(sub))
        stats[0]["lin"] = np.ones(prob.dim)
        sub.solve(stats, 10.0, round=2, nu0=np.zeros(1))
        after = vars(sub)
        changed = [k for k in before if before[k] is not after[k] and k not in ("_value",)]
        assert changed == [], f"{kind}: {changed}"


# -- the runner with any algorithm -----------------------------------------------------------

class Averaging(ss.Method):
    """A toy method: w_{t+1} = the N_i/N-weighted mean of the clients' row means."""

    name = "averaging"
    columns = {"step_norm": ()}

    def __init__(self, data):
        self.N = data.num_samples

    def tasks(self):
        return {"mean": lambda client, req: client.reply(req, {"m": client.X.mean(axis=0)})}

    def init(self, x0):
        from typing import NamedTuple

        class S(NamedTuple):
            t: int
            w: np.ndarray
        self.S = S
        return S(0, x0)

    def request(self, state):
        return Request("mean", state.t + 1, state.w)

    def step(self, state, replies):
        w = sum(r.num_rows / self.N * r.arrays["m"] for r in replies)
        return self.S(state.t + 1, w), float(np.linalg.norm(w - state.w))

    def record(self, info):
        return {"step_norm": info}

    def describe(self, info):
        return f"step {info:.3g}"

    def state_arrays(self, state):
        return {"t": np.asarray(state.t), "w": state.w}

    def state_from_arrays(self, arrays):
        return self.S(int(arrays["t"]), arrays["w"])


def test_runner_drives_any_algorithm_and_keeps_history_in_arrays(cancer_data):
    """2,000 rounds of a toy method: the history stays a few arrays (no Python object per
    round), communication is counted from the messages, the callback sees every round."""
    from ssca_solver.diagnostics.evaluation import Evaluator
    from ssca_solver.federated import build_clients
    from ssca_solver.diagnostics.history import Recorder
    from ssca_solver.engine.options import RunOptions
    from ssca_solver.engine.runner import Runner, Tally
    from ssca_solver.federated.gather import Gatherer

    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    alg = Averaging(cancer_data)
    ev = Evaluator(prob)
    clients = build_clients(cancer_data, 0, {**alg.tasks(), **ev.tasks})
    rec, tally = Recorder(alg.columns, 0), Tally()
    ticks = []
    opts = RunOptions(eval_every=0, callback=lambda it: ticks.append(it.t))
    gatherer = Gatherer(InProcessTransport(clients), cancer_data.client_sizes)
    runner = Runner(alg, gatherer=gatherer, evaluator=ev, opts=opts, recorder=rec,
                    tally=tally, meta={})
    state, reason = runner.run(alg.init(np.zeros(31)), 100)
    gc.collect()
    before = len(gc.get_objects())
    state, reason = runner.run(state, 2000)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert reason == "max_iter" and state.t == 2100 and len(ticks) == 2100
    assert grown < 50, f"{grown} Python objects for 2000 rounds"
    np.testing.assert_allclose(state.w, cancer_data.pooled()[0].mean(axis=0), atol=1e-12)
    assert tally.up == 2100 * 5 * 31 and tally.down == 2100 * 5 * 31
    h = rec.history()
    assert h.t[-1] == 2100 and h.step_norm.shape == (2100,)


def test_reply_counts_floats():
    r = Reply(0, "x", 1, 10, 5, {"a": np.zeros(3), "b": np.zeros((2, 2))})
    assert r.num_floats() == 7


def test_an_exception_in_the_callback_carries_the_state_of_the_finished_round(cancer_data,
                                                                               tmp_path):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)

    def cb(it):
        if it.t == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        prob.solve(batch_size=5, max_iter=10, seed=0, eval_every=2, callback=cb,
                   checkpoint=tmp_path / "ck.npz")
    assert info.value.state.t == 3 and info.value.checkpoint == str(tmp_path / "ck.npz")
    res = prob.solve(batch_size=5, max_iter=10, eval_every=2, resume=tmp_path / "ck.npz")
    ref = prob.solve(batch_size=5, max_iter=10, seed=0, eval_every=2)
    np.testing.assert_array_equal(res.x, ref.x)
    np.testing.assert_array_equal(res.history.eval_t, ref.history.eval_t)


@pytest.fixture(scope="module")
def force_run(cancer_data):
    """Full batches with the quasi-Newton model, c far below the multiplier (0.41): the
    stages end by the penalty's saturation test (counted over rounds) at rounds 12 and 16,
    and the run is certified at round 46."""
    prob = neyman_pearson(cancer_data, alpha=0.1)
    opts = dict(batch_size="full", penalty=[0.01, 0.1, 1.0, 10.0], max_iter=300, seed=0,
                hessian="lbfgs")
    return prob, opts, prob.solve(**opts)


@pytest.mark.parametrize("stop_at", [11, 12, 15, 16, 30])
def test_resume_in_the_full_batch_phase_takes_the_uninterrupted_decisions(force_run, tmp_path,
                                                                           stop_at):
    """What the method counts from round to round outside its state (saturated rounds, the
    best point, the last KKT fit, the backtracking's last trial) is in the checkpoint: a
    resume at 11 or 15 (one saturated round counted) that lost the count would raise c a
    round later. A stop requested at the round that ends a stage (12, 16) is a stop (the
    next stage started instead), and its resume starts the next stage."""
    prob, opts, full = force_run
    assert full.status == "converged" and full.nit == 46
    assert [s.rounds for s in full.stages] == [12, 4, 30]
    path = tmp_path / "run.ckpt"
    first = prob.solve(checkpoint=path, callback=lambda it: it.t == stop_at, **opts)
    assert first.status == "stopped" and first.nit == stop_at
    res = prob.solve(resume=path, **{k: v for k, v in opts.items() if k != "seed"})
    assert res.status == full.status and res.nit == full.nit
    assert res.stages == full.stages
    np.testing.assert_allclose(res.x, full.x, rtol=1e-12, atol=1e-12)
    for name in full.history.names:
        np.testing.assert_allclose(getattr(res.history, name), getattr(full.history, name),
                                   rtol=1e-12, atol=1e-12, err_msg=name)
