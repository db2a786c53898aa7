import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.schedules import check_schedules, step_value


def test_powerstep_values():
    s = ss.PowerStep(0.6, 0.3)
    assert s(1) == 0.6
    assert np.isclose(s(10), 0.6 / 10 ** 0.3)


@pytest.mark.parametrize("a, alpha", [(0, 0.5), (-1, 0.5), (1, -0.1), (np.inf, 0.5)])
def test_powerstep_rejects_bad_parameters(a, alpha):
    with pytest.raises(ss.ScheduleError):
        ss.PowerStep(a, alpha)


def test_valid_pair_does_not_warn():
    assert check_schedules(ss.PowerStep(0.9, 0.4), ss.PowerStep(0.9, 0.55)) == []


def test_paper_section_vi_choice_violates_sum_gamma_squared():
    # Section VI: rho = a1/t^0.3, gamma = a2/t^0.35 (B = 10); sum gamma^2 diverges
    with pytest.warns(ss.ScheduleWarning, match="sum gamma_t\\^2"):
        issued = check_schedules(ss.PowerStep(0.6, 0.3), ss.PowerStep(0.9, 0.35))
    assert len(issued) == 1


def test_gamma_must_decay_faster_than_rho():
    with pytest.warns(ss.ScheduleWarning, match="gamma/rho"):
        check_schedules(ss.PowerStep(0.9, 0.7), ss.PowerStep(0.9, 0.6))


def test_rho_must_decay():
    with pytest.warns(ss.ScheduleWarning, match="rho"):
        check_schedules(ss.PowerStep(0.5, 0.0), ss.PowerStep(0.9, 0.6))


def test_values_outside_unit_interval_are_errors():
    with pytest.raises(ss.ScheduleError, match=r"rho\(1\) = 1.5"):
        step_value(ss.PowerStep(1.5, 0.5), 1, "rho")
    with pytest.raises(ss.ScheduleError, match="gamma"):
        step_value(lambda t: -0.1, 3, "gamma")
    with pytest.raises(ss.ScheduleError, match="raised at t=2"):
        step_value(lambda t: 1 / (t - 2), 2, "gamma")
    assert step_value(lambda t: 1 / t, 4, "rho") == 0.25
