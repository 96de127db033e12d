"""The same code on a dask.distributed cluster: two worker processes quantize an array read lazily
from a zarr store and write the result back to zarr."""

import numpy as np
import pytest

import qlinear

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    with distributed.Client(cluster) as client:
        yield client
    cluster.close()


def test_quantize_zarr_to_zarr_on_two_worker_processes(client, tmp_path):
    rng = np.random.default_rng(3)
    data = rng.standard_normal((64, 96)).astype(np.float32)
    source = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=data.shape, chunks=(16, 40), dtype="float32")
    source[:] = data
    scales = (np.abs(data).reshape(64, 3, 32).max(axis=2) / 7).astype(np.float32)  # blocks of 32 along axis 1

    x = da.from_zarr(str(tmp_path / "x.zarr"))
    q = qlinear.quantize_linear(x, scales, axis=1, block_size=32, output_dtype="int8")
    q.to_zarr(str(tmp_path / "q.zarr"))

    workers = client.run(lambda: __import__("os").getpid())
    assert len(set(workers.values())) == 2
    written = zarr.open_array(str(tmp_path / "q.zarr"), mode="r")[:]
    np.testing.assert_array_equal(written, qlinear.quantize_linear(data, scales, axis=1, block_size=32, output_dtype="int8"))
