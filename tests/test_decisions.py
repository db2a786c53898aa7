"""The decision points that mutation testing found untested, each with a test that fails when
the rule is changed:

1. "infeasible" only at the largest penalty of the sequence;
2. "infeasible" only when the last stage's slack exceeds ``slack_tol`` (and with every other
   piece of evidence: each missing piece gives its own "max_iter" message);
3. the continuation raises c on a multiplier estimate of at least c / 2 (not 5 c), from the
   KKT fit or from the forces that balance the gradients;
4. a checkpoint missing any of its members (the state's memory, the tallies, the dropouts
   included) is refused, whether or not its checksums were edited to match.
"""

from __future__ import annotations

import io
import json
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver import status as st
from ssca_solver.methods.ssca import SSCA, continuation, evidence
from ssca_solver.methods.ssca.state import remember


# -- 1, 2: the evidence behind "infeasible" -----------------------------------------------------

def _infeasible(**changes) -> evidence.Evidence:
    """Evidence with every piece "infeasible" needs (then ``changes`` applied)."""
    e = evidence.Evidence(
        reason=st.MAX_ITER, t=400, max_iter=800, constrained=True, penalty=1e5, largest=1e5,
        residual=("feasibility of constraint 1", 0.5, 1e-4), violation=0.5, violation_sum=0.5,
        worst=1, worst_violation=0.5, ever_feasible=False, stalled=True, first=0.5,
        second=0.5, stage_slack=0.5, stage_penalty=1e5, slack_tol=1e-3, evaluations=40,
        rejects=0, advice="feasibility", fixed_batch=False, feas_tol=1e-4, phase1=0.0,
        saddle=0.0, convex=True)
    return e._replace(**changes)


def test_infeasible_needs_every_piece_of_evidence():
    assert evidence.classify(_infeasible(), tested=True) == "infeasible"
    missing = {
        # 1. a stage below the largest penalty: c may be too small
        "stage_penalty": (1e4, "no_feasible_stalled"),
        # 2. a last stage whose slack is within slack_tol: the surrogate constraints are met
        "stage_slack": (1e-3, "no_feasible_stalled"),
        "ever_feasible": (True, "not_passed"),
        "stalled": (False, "no_feasible_decreasing"),
        "violation": (1e-5, "not_passed"),
        "phase1": (0.5, "not_minimiser"),
        "saddle": (1.0, "saddle"),
        # constraints not declared convex: a local minimum of the violation proves nothing
        # about points elsewhere
        "convex": (False, "local_infeasibility"),
    }
    for field, (value, code) in missing.items():
        assert evidence.classify(_infeasible(**{field: value}), tested=True) == code, field
    # and a saddle that could not be probed is no evidence either
    assert evidence.classify(_infeasible(saddle=float("nan")), True) == "saddle_untested"


def test_the_messages_name_what_is_missing():
    below = _infeasible(stage_penalty=1e4, penalty=1e4)
    text = evidence.MESSAGES["no_feasible_stalled"].format(**evidence._fields(below))
    assert "c = 10000 is not the largest penalty" in text
    met = _infeasible(stage_slack=5e-4)
    text = evidence.MESSAGES["no_feasible_stalled"].format(**evidence._fields(met))
    assert "slack estimate (0.0005) is within slack_tol=0.001" in text
    # every message of the table can be written from a record
    for code, template in evidence.MESSAGES.items():
        assert template.format(**evidence._fields(_infeasible())), code


# -- 3: the continuation's multiplier evidence ---------------------------------------------------

class _Recorder:
    """The history of one full-batch stage whose violation is still falling (so neither a
    stalled violation nor a lack of evaluations is evidence), with slack above slack_tol."""

    def __init__(self):
        self.h = SimpleNamespace(t=np.arange(1, 9), stage=np.zeros(8, int),
                                 eval_t=np.array([2, 4, 6, 8]),
                                 constraints=np.array([[0.5], [0.4], [0.3], [0.2]]))

    def stage_rows(self, name, stage):
        return {"slack": np.full((8, 1), 0.1), "batch_size": np.full(8, np.nan)}[name]

    def history(self):
        return self.h


@pytest.fixture
def method(cancer_data):
    from problems.neyman_pearson import neyman_pearson

    prob = neyman_pearson(cancer_data, alpha=0.1)
    options = {"batch_size": "full", "penalty": [10.0, 100.0]}
    return SSCA.build(prob, SSCA.parse(prob, options), options)


@pytest.mark.parametrize("source", ["fit", "forces"])
def test_c_is_raised_on_a_multiplier_of_at_least_half_of_it(method, source, monkeypatch):
    cfg = method.config
    state = method.init(np.zeros(method.problem.dim), penalty=10.0)
    for mu, raised in ((6.0, True), (4.0, False), (5.0, True)):
        if source == "fit":
            given = remember(state, multipliers=np.array([mu]))
            monkeypatch.setattr(continuation, "force_multipliers", lambda cfg, s: None)
        else:
            given = remember(state, multipliers=np.array([0.0]))
            monkeypatch.setattr(continuation, "force_multipliers",
                                lambda cfg, s, mu=mu: np.array([mu]))
        new = continuation.next_stage(cfg, given, 1, _Recorder())
        assert (new.penalty == 100.0) is raised, (source, mu)


def test_a_stage_that_saturated_raises_c_and_the_flag_is_spent(method, monkeypatch):
    monkeypatch.setattr(continuation, "force_multipliers", lambda cfg, s: None)
    state = remember(method.init(np.zeros(method.problem.dim), penalty=10.0),
                     multipliers=np.array([0.0]), c_too_small=True)
    new = continuation.next_stage(method.config, state, 1, _Recorder())
    assert new.penalty == 100.0 and not new.memory.c_too_small


# -- 4: every member of a checkpoint is required ------------------------------------------------

def _members(path):
    with zipfile.ZipFile(path) as zf:
        return [i.filename[:-4] for i in zf.infolist()]


def _without(path, out, member, keep_sums: bool):
    """A copy of the checkpoint at ``path`` without ``member``; its checksum entry dropped
    too unless ``keep_sums``."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            name = info.filename[:-4]
            if name == member:
                continue
            data = src.read(info)
            if name == "__meta__" and not keep_sums:
                meta_arr = np.load(io.BytesIO(data), allow_pickle=False)
                meta = json.loads(str(meta_arr))
                meta["checksums"].pop(member, None)
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.array(json.dumps(meta)))
                data = buf.getvalue()
            dst.writestr(info, data)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A checkpoint of a constrained run with the quasi-Newton model on (the memory's best
    point and statistics present), the backtracking's reference point, and dropouts: a sixth
    client whose functions always raise is dropped in every exchange."""
    from problems.logistic import logistic_loss

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(30, 3)), rng.integers(0, 2, 30).astype(float))
               for _ in range(4)]
    clients.append((np.full((5, 3), 7.0), np.zeros(5)))           # the client that is down
    data = ss.FederatedData(clients)
    loss = logistic_loss()

    def value(w, X, y):
        if np.all(X == 7.0):
            raise RuntimeError("this client is down")
        return loss.value(w, X, y)

    def grad(w, X, y):
        if np.all(X == 7.0):
            raise RuntimeError("this client is down")
        return loss.grad(w, X, y)

    f = ss.SampleFunction(value, grad, name="loss")
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w) + 0.0 * X[:, 0],
                             lambda w, X, y: 2.0 * w, name="norm")
    prob = ss.Problem(f, [norm <= 0.05], dim=3, data=data)
    path = str(tmp_path_factory.mktemp("ck") / "run.npz")
    res = prob.solve(max_iter=60, seed=0, batch_size="full", on_client_failure="drop",
                     checkpoint=path, checkpoint_every=100, callback=lambda it: it.t == 12)
    assert res.status == "stopped" and res.nit == 12 and res.dropouts
    return prob, path


def test_the_checkpoint_holds_the_whole_memory(written):
    _, path = written
    names = _members(path)
    for group in ("state/mem/", "state/mem/best/", "state/prev_stats/", "tally/",
                  "dropouts/", "history/"):
        assert any(n.startswith(group) for n in names), group
    # and the resume goes on from it
    prob, _ = written
    res = prob.solve(max_iter=60, seed=0, batch_size="full", on_client_failure="drop",
                     resume=path)
    assert res.nit > 12


@pytest.mark.parametrize("keep_sums", [True, False])
def test_a_checkpoint_missing_any_member_is_refused(written, tmp_path, keep_sums):
    prob, path = written
    refused = []
    for member in _members(path):
        if member == "__meta__":
            continue
        out = str(tmp_path / f"without_{len(refused)}.npz")
        _without(path, out, member, keep_sums)
        with pytest.raises(ss.CheckpointError):
            prob.solve(max_iter=60, seed=0, batch_size="full", on_client_failure="drop",
                       resume=out)
        refused.append(member)
    assert any(m.startswith("state/mem/") for m in refused)
    assert any(m.startswith("tally/") for m in refused)
    assert any(m.startswith("dropouts/") for m in refused)


def test_each_check_refuses_a_missing_member_on_its_own(written):
    """The refusal does not rest on one check: the checksums list every member written; the
    layout requires every field of a fresh state, history column and a complete set of
    dropouts; the state requires every field of the state and its memory and a whole group of
    statistics (or none, where its point is empty); the tallies require each count."""
    import re

    from ssca_solver.diagnostics.history import Recorder
    from ssca_solver.engine import checkpoint as ckpt
    from ssca_solver.engine.runner import Tally, state_arrays_from

    prob, path = written
    arrays, meta = ckpt.load(path)
    options = {"batch_size": "full", "on_client_failure": "drop", "max_iter": 60}
    method = SSCA.build(prob, SSCA.parse(prob, options), options)
    recorder = Recorder(method.columns, prob.num_constraints)
    layout = ckpt.Layout(method.state_arrays(method.init(np.zeros(prob.dim))),
                         {k: c.shape for k, c in recorder.columns.items()}, prob.dim,
                         len(prob.functions), prob.num_constraints, prob.data.num_clients,
                         method.num_stages, method.state_rows)
    layout.check(arrays, meta, path)
    ckpt._check_sums(arrays, meta, path)
    state = state_arrays_from(arrays)
    method.state_from_arrays(state)
    checked = {"sums": 0, "layout": 0, "state": 0, "tally": 0}
    for name in arrays:
        rest = {k: v for k, v in arrays.items() if k != name}
        with pytest.raises(ss.CheckpointError, match=re.escape(f"{name} is missing")):
            ckpt._check_sums(rest, meta, path)
        checked["sums"] += 1
        fresh = name[len("state/"):] in layout.state if name.startswith("state/") else False
        if fresh or name.startswith(("history/", "dropouts/")):
            with pytest.raises(ss.CheckpointError):
                layout.check(rest, meta, path)
            checked["layout"] += 1
        if name.startswith("state/"):
            with pytest.raises(ValueError, match="the checkpoint"):
                method.state_from_arrays(state_arrays_from(rest))
            checked["state"] += 1
        if name.startswith("tally/"):
            with pytest.raises(KeyError):
                Tally().load(rest)
            checked["tally"] += 1
    assert all(checked.values()), checked
    # a whole group of statistics missing while its point is not empty
    for group in ("prev_stats/", "mem/best/"):
        rest = {k: v for k, v in state.items() if not k.startswith(group)}
        assert len(rest) < len(state), group
        with pytest.raises(ValueError, match="not its statistics"):
            method.state_from_arrays(rest)


# -- a trial point where a function's arithmetic fails is a rejected step ----------------------

def test_an_overflow_at_a_trial_point_is_a_rejected_step():
    """A function whose own arithmetic fails at a point (math.exp overflowing, as an
    objective written with Python floats does far from its optimum) has no finite value
    there: at a trial point of the backtracking the client answers "non-finite" and the
    server steps back, as for a returned inf; anywhere else it is the user's error."""
    import math

    from conftest import round_request, ssca_clients
    from ssca_solver.methods.ssca.client import NONFINITE, REJECT_NONFINITE

    def value(w, X, y):
        return np.array([math.exp(w[0] * x) for x in X[:, 0]])

    def grad(w, X, y):
        return np.array([np.mean([x * math.exp(w[0] * x) for x in X[:, 0]])])

    data = ss.FederatedData([(np.ones((4, 1)), None), (np.ones((3, 1)), None)])
    prob = ss.Problem(ss.SampleFunction(value, grad, name="expo"), dim=1, data=data)
    client = ssca_clients(prob)[0]
    far = np.array([1000.0])                           # exp(1000) overflows
    trial = round_request(3, far, None)
    trial.config[REJECT_NONFINITE] = True
    assert NONFINITE in client.handle(trial).arrays
    with pytest.raises(ss.UserFunctionError, match="OverflowError"):
        client.handle(round_request(3, far, None))
