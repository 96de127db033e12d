"""`qlinear bench` runs end to end on a tiny selection and writes its JSON (no timing assertions)."""

import json

from qlinear.cli import main


def test_bench_writes_a_row_per_case_and_size(tmp_path, capsys):
    out = tmp_path / "bench.json"
    status = main(["bench", "--sizes", "64K", "--case", "Q f32->uint8", "DQ int4", "--skip", "onnx", "tensorflow",
                   "--no-jit", "--repeat", "1", "--json", str(out)])
    assert status == 0
    results = json.loads(out.read_text())
    assert [(r["case"], r["size"]) for r in results["rows"]] == [
        ("Q f32->uint8 tensor", "64K"), ("Q f32->uint8 tensor out=", "64K"), ("DQ int4->f32 block32", "64K")]
    for row in results["rows"]:
        assert row["qlinear_s"] > 0 and row["probe_s"] > 0 and row["copy_probe_s"] > 0 and row["moved_bytes"] > 0
        assert "numpy_s" in row
    # the out= row writes into a preallocated array: no result-sized allocation (64 KB here)
    assert results["rows"][1]["peak_extra_bytes"] < 16 << 10
    # onnxruntime cannot feed int4 arrays: n/a, not an error
    assert results["rows"][2]["ort1_s"] is None
    assert "Q f32->uint8 tensor" in capsys.readouterr().out


def test_bench_rejects_an_unknown_size(capsys):
    try:
        main(["bench", "--sizes", "3M"])
    except SystemExit as exit_:
        assert exit_.code == 2
    assert "invalid choice: '3M'" in capsys.readouterr().err


def test_bench_conv_times_the_layers_at_each_thread_count(tmp_path, capsys):
    out = tmp_path / "conv.json"
    status = main(["bench", "--conv", "--filter", "dw3x3 960", "--threads", "1", "--min-time", "0.01", "--json",
                   str(out)])
    assert status == 0
    results = json.loads(out.read_text())
    assert [r["layer"] for r in results["rows"]] == ["mobilenetv2 dw3x3 960/1 @7"]
    row = results["rows"][0]
    assert row["qlinear_1t_ms"] > 0 and results["cpu"] and results["thread_counts"] == [1]
    if results["rows"][0]["onnxruntime_1t_ms"] is not None:  # onnxruntime is installed with the test extras
        assert row["ratio_1t"] == row["qlinear_1t_ms"] / row["onnxruntime_1t_ms"]
    assert "mobilenetv2 dw3x3 960/1 @7" in capsys.readouterr().out


def test_bench_conv_keeps_the_best_time_of_its_alternating_rounds(monkeypatch):
    from qlinear import bench_conv

    given = iter([{"mobilenetv2 dw3x3 960/1 @7|1": 0.003}, {"mobilenetv2 dw3x3 960/1 @7|1": 0.001},
                  {"mobilenetv2 dw3x3 960/1 @7|1": 0.002}])
    monkeypatch.setattr(bench_conv, "time_qlinear", lambda *args: next(given))
    results = bench_conv.run("dw3x3 960", [1], peer=False, rounds=3)
    assert results["rounds"] == 3 and results["rows"][0]["qlinear_1t_ms"] == 1.0


def test_bench_conv_refuses_what_it_cannot_time(capsys):
    for args, message in ((["--filter", "no such layer"], "no layer's name contains 'no such layer'"),
                          (["--threads", "0"], "--threads: each count must lie in [1, "),
                          (["--min-time", "0"], "--min-time must be positive"),
                          (["--rounds", "0"], "--rounds must be at least 1"),
                          (["--case", "Q"], "--conv takes --filter")):
        assert main(["bench", "--conv", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
