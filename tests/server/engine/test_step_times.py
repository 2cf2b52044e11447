"""The step-time model (engine.step_times): a line over rows and prompt tokens, its shape measured at start-up
(on a real worker too), its scale following the iterations served."""

from __future__ import annotations

import pytest
from txl_server.engine.step_times import Measured, StepTimes, measure_steps

PRIOR = Measured(((1, 0, 0.002), (8, 0, 0.009), (0, 64, 0.010), (8, 64, 0.018)), one_row=0.002, segment=0.010)


def test_before_serving_it_is_the_start_up_line():
    times = StepTimes(PRIOR)
    a, b, c = times.coefficients()
    assert (a, b, c) == pytest.approx((0.001, 0.001, 0.009 / 64), rel=1e-6)
    assert times.iteration(4, 0) == pytest.approx(0.005)


def test_it_follows_what_the_served_iterations_take():
    times = StepTimes(PRIOR)
    for i in range(400):  # the machine is three times slower now, at every shape
        rows, tokens = 1 + i % 16, (i * 7) % 96
        times.observe(rows, tokens, 3 * (0.001 + 0.001 * rows + 0.000141 * tokens))
    assert times.iteration(12, 0) == pytest.approx(3 * 0.013, rel=0.1)
    assert times.per_token() == pytest.approx(3 * 0.000141, rel=0.15)


def test_iterations_of_one_shape_scale_the_measured_line_whole():
    times = StepTimes(PRIOR)
    for _ in range(500):
        times.observe(1, 0, 0.004)  # one row, twice the start-up's
    assert times.iteration(1, 0) == pytest.approx(0.004, rel=0.05)
    # Eight rows: twice the start-up's too (a slope fitted to one-row steps alone would say nothing of them).
    assert times.iteration(8, 0) == pytest.approx(2 * 0.009, rel=0.05)
    times.observe(1, 0, 100.0)  # a pause of the whole process is not a new machine
    assert times.iteration(1, 0) < 0.2


def test_a_real_worker_is_measured(tiny_model_dir):
    from txl_server.runtime import load_model, make_worker
    from txl_server.settings import Settings

    settings = Settings(model=tiny_model_dir, ephemeral=True)
    worker = make_worker(settings, load_model(settings))
    measured = measure_steps(worker, rows=4, repeat=2)
    assert measured.one_row > 0 and measured.segment > 0
    assert [p[:2] for p in measured.points] == [
        (1, 0),
        (4, 0),
        (0, worker.segment_len),
        (4, worker.segment_len),
    ]
    assert worker.pool.used_blocks == 0  # the measurement's memories are gone
