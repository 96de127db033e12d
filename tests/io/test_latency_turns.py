"""How `qlinear quantize`'s report times the float and the quantized model (`qlinear.io.latency`): the models
take turns, every model gets the runs asked for, and on more than one thread no two sessions exist at once
(an idle session's spinning workers would take the timed session's second core)."""

from __future__ import annotations

import pytest

from qlinear.io import latency


class _Sessions:
    """A stand-in for onnxruntime sessions that records which exist while each run happens."""

    def __init__(self):
        self.alive: set[int] = set()
        self.most_alive = 0
        self.made: list[tuple[str, int]] = []
        self.runs: list[str] = []

    def __call__(self, model, threads, optimized=None):
        sessions = self

        class Session:
            def __init__(self):
                sessions.made.append((model, threads))
                sessions.alive.add(id(self))

            def run(self, outputs, feeds):
                sessions.most_alive = max(sessions.most_alive, len(sessions.alive))
                sessions.runs.append(model)

            def __del__(self):
                sessions.alive.discard(id(self))

        return Session()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_the_models_take_turns_and_get_their_runs(monkeypatch, threads):
    fake = _Sessions()
    monkeypatch.setattr(latency, "session", fake)
    times = latency.timed_in_turns(["float", "quantized"], {}, threads, min_runs=7, max_runs=7, budget_s=60.0)
    assert [len(t) for t in times] == [7, 7]
    timed = list(fake.runs)
    # No model runs twice as often as the other at any point: they alternate (singly, or in rounds).
    for prefix in range(1, len(timed) + 1):
        counts = [timed[:prefix].count(m) for m in ("float", "quantized")]
        assert abs(counts[0] - counts[1]) <= latency.ROUND_RUNS + latency.WARM_UP
    if threads == 1:
        assert fake.made == [("float", 1), ("quantized", 1)]  # open for the whole measurement
        assert fake.most_alive == 2
    else:
        assert fake.most_alive == 1  # one session at a time
        assert len(fake.made) == 2 * -(-7 // latency.ROUND_RUNS)  # a new session per model and round
        assert all(t == threads for _, t in fake.made)


def test_the_budget_bounds_the_runs_beyond_the_minimum(monkeypatch):
    fake = _Sessions()
    monkeypatch.setattr(latency, "session", fake)
    times = latency.timed_in_turns(["a", "b"], {}, 2, min_runs=3, max_runs=50, budget_s=0.0)
    assert [len(t) for t in times] == [min(latency.ROUND_RUNS, 50)] * 2  # the first round; the budget is spent
    times = latency.timed_in_turns(["a", "b"], {}, 1, min_runs=3, max_runs=50, budget_s=0.0)
    assert [len(t) for t in times] == [3, 3]
