"""`--calibrate` files (`activation_calibration.CalibrationData`): samples along the inputs' first axis, each fed as
a batch of one; a file whose inputs share no first axis (a stateful model's state, a scalar) is one sample, fed as
it is."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.io.activation_calibration import CalibrationData
from qlinear.io.errors import UserError


def test_samples_along_the_first_axis_are_fed_as_batches_of_one(tmp_path):
    x = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    np.savez(tmp_path / "a.npz", x=x, y=x[:, :1])
    data = CalibrationData.open([tmp_path / "a.npz"], ["x", "y"])
    assert data.samples == 3
    fed = list(data)
    assert [f["x"].shape for f in fed] == [(1, 2, 4)] * 3
    np.testing.assert_array_equal(fed[2]["x"][0], x[2])


def test_a_file_whose_inputs_share_no_first_axis_is_one_sample_fed_as_it_is(tmp_path):
    rng = np.random.default_rng(0)
    frames = [(rng.standard_normal((1, 8)).astype(np.float32), rng.standard_normal((2, 1, 3)).astype(np.float32))
              for _ in range(2)]
    for i, (frame, state) in enumerate(frames):
        np.savez(tmp_path / f"{i}.npz", input=frame, state=state, sr=np.array(16000, np.int64))
    data = CalibrationData.open([tmp_path], ["input", "state", "sr"])
    assert data.samples == 2
    fed = list(data)
    for (frame, state), feeds in zip(frames, fed):
        np.testing.assert_array_equal(feeds["input"], frame)
        np.testing.assert_array_equal(feeds["state"], state)
        assert feeds["sr"].shape == () and feeds["sr"] == 16000


def test_a_missing_input_is_named(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((2, 3), np.float32))
    with pytest.raises(UserError, match="'state'"):
        CalibrationData.open([tmp_path / "a.npz"], ["x", "state"])
