"""Reading the peak memory a published row states (sim.studies.published_memory)."""

from __future__ import annotations

import pytest

from sim.studies.published_memory import GB, GIB, memory_figure


@pytest.mark.parametrize(("row", "nbytes", "kind"), [
    ({"metric": "peak GPU memory (allocated)", "value": "35", "unit": "GB"}, 35 * GB, "allocated"),
    ({"metric": "peak GPU memory (reserved by caching allocator)", "value": "78", "unit": "GB"}, 78 * GB, "reserved"),
    ({"metric": "max cached GPU memory allocated", "value": "25.6", "unit": "GB per GPU"}, 25.6 * GB, "reserved"),
    ({"metric": "throughput", "other_reported_metrics": "peak memory 82.4 GiB", "framework": "TorchTitan"},
     82.4 * GIB, "reserved"),          # torchtitan logs max_reserved
    ({"metric": "iteration time", "other_reported_metrics": "TFLOP/s/GPU 109.22; peak GPU mem 56GB"},
     56 * GB, "unstated"),
    ({"metric": "iteration time", "other_reported_metrics": "6.4 samples/s; allocated 4.32 GB, max allocated 8.09 GB"},
     8.09 * GB, "allocated"),          # the peak, not the current figure
    ({"metric": "OOM (memory)", "value": "OOM"}, None, "OOM"),
])
def test_figures_and_what_they_count(row, nbytes, kind):
    figure = memory_figure(row)
    assert figure is not None and figure.kind == kind
    assert figure.nbytes == (None if nbytes is None else pytest.approx(nbytes))


@pytest.mark.parametrize("row", [
    {"metric": "iteration time", "other_reported_metrics": "TFLOP/s/GPU 133.08; peak GPU mem not recorded"},
    {"metric": "throughput", "other_reported_metrics": ""},
    {"metric": "peak GPU memory", "value": "n/a", "unit": ""},
])
def test_rows_without_a_number_have_no_figure(row):
    assert memory_figure(row) is None
