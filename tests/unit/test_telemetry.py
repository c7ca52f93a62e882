"""Per-epoch training telemetry: a rank's meter on batches whose cost is known, the job's
totals over its ranks, the message rank 0 reports, and what the launching step makes of it (the
MLflow run's epoch metrics, the asset's table, peaks and plot)."""

import gc
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ml import telemetry
from ml.telemetry import (
    CPU_UTILISATION,
    MIB,
    EpochMeter,
    EpochTelemetry,
    JobEpoch,
    gather,
    packed,
    run_peaks,
    unpacked,
)
from ml.training_run import EpochMetrics, epoch_logger, plan_training, trained_run
from tests.unit.test_training_run import CHOSEN, LINK, FakeTracker, reported
from usecases.flights import USE_CASE as FLIGHTS

pytestmark = pytest.mark.unit


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def slow_batches(clock: Clock, waits_s: list[float]) -> Iterator[int]:
    """Batches 0, 1, ... each taking its wait (in `clock`'s time) to arrive."""
    for number, wait_s in enumerate(waits_s):
        clock.advance(wait_s)
        yield number


def figures(rank: int, rows: int, wall_s: float, wait_s: float, peak: int) -> EpochTelemetry:
    return EpochTelemetry(
        epoch=1,
        rank=rank,
        device="cpu",
        rows=rows,
        steps=rows // 10,
        wall_s=wall_s,
        data_wait_s=wait_s,
        memory_bytes=peak // 2,
        memory_reserved_bytes=None,
        peak_memory_bytes=peak,
        utilisation=0.5 + rank / 10,
        utilisation_source=CPU_UTILISATION,
    )


def test_the_meter_counts_time_in_the_iterator_as_waiting_and_the_rest_as_stepping():
    clock, cpu = Clock(), Clock()
    meter = EpochMeter(0, "cpu", threads=2, clock=clock, cpu_clock=cpu)

    seen = []
    for batch in meter.timed(slow_batches(clock, [0.5, 0.1, 0.1, 0.3])):
        clock.advance(1.0)  # the step
        cpu.advance(1.5)  # two threads, three quarters busy
        meter.step(rows=64)
        seen.append(batch)
    clock.advance(0.25)  # after the last batch: the iterator's end, then the close
    epoch = meter.close(3)

    assert seen == [0, 1, 2, 3]
    assert (epoch.epoch, epoch.rank, epoch.rows, epoch.steps) == (3, 0, 256, 4)
    assert epoch.wall_s == pytest.approx(5.25)
    assert epoch.data_wait_s == pytest.approx(1.0)
    assert epoch.samples_per_s == pytest.approx(256 / 5.25)
    assert epoch.data_wait_fraction == pytest.approx(1.0 / 5.25)
    assert epoch.utilisation == pytest.approx(6.0 / 5.25 / 2)
    assert epoch.utilisation_source == CPU_UTILISATION


def test_each_epoch_starts_from_nothing_and_an_epoch_never_timed_cannot_close():
    clock = Clock()
    meter = EpochMeter(1, "cpu", threads=1, clock=clock, cpu_clock=Clock())
    for _ in meter.timed(slow_batches(clock, [2.0, 2.0])):
        meter.step(10)
    meter.close(1)

    for _ in meter.timed(slow_batches(clock, [0.5])):
        clock.advance(0.5)
        meter.step(7)
    second = meter.close(2)

    assert (second.rows, second.steps, second.rank) == (7, 1, 1)
    assert second.wall_s == pytest.approx(1.0) and second.data_wait_fraction == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match="epoch 3 closed before its batches were timed"):
        meter.close(3)


def test_a_cpu_ranks_memory_is_its_resident_set_and_follows_what_it_holds():
    # Large beside what the rest of the process frees meanwhile (another test's threads): a
    # 64 MiB step failed once under xdist, when some megabytes were given back between readings.
    gc.collect()
    meter = EpochMeter(0, "cpu", threads=1)
    for _ in meter.timed([None]):
        meter.step(1)
    before = meter.close(1)
    held = b"\x01" * (256 * MIB)  # written, so resident
    for _ in meter.timed([held]):
        meter.step(1)
    after = meter.close(2)

    assert after.memory_bytes - before.memory_bytes >= 224 * MIB
    assert after.peak_memory_bytes >= after.memory_bytes >= 224 * MIB
    assert before.memory_reserved_bytes is None and after.device == "cpu"
    assert len(held) == 256 * MIB


def test_the_jobs_figures_are_every_ranks_rows_over_the_slowest_and_the_highest_memory():
    job = JobEpoch(1, (figures(0, 1000, 2.0, 0.2, 300), figures(1, 1000, 4.0, 1.0, 500)))

    assert job.samples_per_s == pytest.approx(2000 / 4.0)
    assert job.data_wait_fraction == pytest.approx(1.2 / 6.0)
    assert job.utilisation == pytest.approx(0.55)
    assert job.memory() == {"rss_bytes": 250, "peak_rss_bytes": 500}
    assert job.metrics() == pytest.approx(
        {
            "samples_per_s": 500.0,
            "data_wait_fraction": 0.2,
            "utilisation": 0.55,
            "rss_bytes": 250.0,
            "peak_rss_bytes": 500.0,
            "samples_per_s_rank0": 500.0,
            "data_wait_fraction_rank0": 0.1,
            "peak_rss_bytes_rank0": 300.0,
            "samples_per_s_rank1": 250.0,
            "data_wait_fraction_rank1": 0.25,
            "peak_rss_bytes_rank1": 500.0,
        }
    )


def test_a_gpus_memory_goes_by_torchs_names_and_reserved_memory_counts():
    on_gpu = replace(figures(0, 100, 1.0, 0.0, 900), device="cuda", memory_reserved_bytes=2048)

    memory = JobEpoch(1, (on_gpu,)).memory()

    assert memory == {
        "memory_allocated_bytes": 450,
        "max_memory_allocated_bytes": 900,
        "memory_reserved_bytes": 2048,
    }


def test_the_message_is_json_and_reads_back_as_the_same_epoch():
    job = JobEpoch(4, (figures(0, 640, 1.5, 0.1, 300), figures(1, 576, 1.4, 0.3, 310)))

    message = json.loads(json.dumps(job.to_message(), allow_nan=False))

    assert JobEpoch.from_message(message) == job
    assert message["samples_per_s"] == pytest.approx(1216 / 1.5)
    assert [r["rank"] for r in message["ranks"]] == [0, 1]


def test_a_message_without_a_ranks_figure_is_refused_by_name():
    message = JobEpoch(1, (figures(0, 10, 1.0, 0.1, 5),)).to_message()
    del message["ranks"][0]["data_wait_s"]

    with pytest.raises(ValueError, match=r"lacks \['data_wait_s'\]"):
        JobEpoch.from_message(message)
    with pytest.raises(ValueError, match="a list of ranks"):
        JobEpoch.from_message({"epoch": 1, "ranks": []})


def test_without_a_process_group_a_rank_gathers_its_own_figures():
    alone = figures(0, 10, 1.0, 0.1, 5)

    assert gather(alone) == JobEpoch(1, (alone,))


def test_a_ranks_figures_cross_the_gather_as_numbers_and_come_back_whole():
    on_cpu = replace(figures(1, 640, 1.25, 0.125, 3 * 2**40 + 7), utilisation=None)
    on_gpu = replace(on_cpu, device="cuda", memory_reserved_bytes=2**33 + 1, utilisation=0.875)

    for sent in (on_cpu, on_gpu):
        numbers = packed(sent)
        assert all(isinstance(n, float) for n in numbers)
        back = unpacked(replace(sent, rank=0, rows=0), 1, numbers)
        assert back == sent
        assert isinstance(back.peak_memory_bytes, int) and isinstance(back.rows, int)


def test_the_runs_peaks_are_over_every_epoch_and_rank():
    epochs = [
        JobEpoch(1, (figures(0, 1000, 2.0, 0.5, 300), figures(1, 1000, 2.0, 0.5, 700))),
        JobEpoch(2, (figures(0, 1000, 1.0, 0.0, 400), figures(1, 1000, 1.0, 0.0, 600))),
    ]
    epochs[1] = replace(epochs[1], epoch=2)

    assert run_peaks(epochs) == pytest.approx(
        {
            "peak_rss_bytes": 700,
            "data_wait_fraction": 1.0 / 6.0,
            "lowest_samples_per_s": 1000.0,
            "highest_samples_per_s": 2000.0,
            "mean_utilisation": 0.55,
        }
    )
    assert run_peaks([]) == {}


def test_the_table_has_a_row_per_epoch_and_a_column_per_rank():
    job = JobEpoch(2, (figures(0, 1000, 2.0, 0.5, 3 * MIB), figures(1, 1000, 2.0, 0.1, MIB)))

    head, rule, row = telemetry.table([job]).splitlines()

    assert head == (
        "| epoch | samples/s | rank 0 samples/s | rank 1 samples/s | data wait | rss MiB"
        " | peak_rss MiB | utilisation |"
    )
    assert rule == "|" + "---|" * 8
    assert row == "| 2 | 1,000 | 500 | 500 | 15.0% | 1.5 | 3.0 | 55% |"


def test_the_plot_draws_every_epoch():
    epochs = [JobEpoch(e, (replace(figures(0, 100 * e, 1.0, 0.1, MIB), epoch=e),)) for e in (1, 2)]

    assert telemetry.plot(epochs).startswith(b"\x89PNG")


def message(epoch: int, job: JobEpoch | None) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 0.7,
        "validation_loss": 0.6,
        "telemetry": job and job.to_message(),
    }


def test_each_epochs_telemetry_is_logged_with_its_losses_and_a_bad_one_is_left_out(caplog):
    tracker = FakeTracker()
    log = epoch_logger(tracker)
    job = JobEpoch(1, (figures(0, 1000, 2.0, 0.5, 300), figures(1, 1000, 2.0, 0.1, 200)))
    broken = job.to_message()
    del broken["ranks"][1]["rows"]

    log(message(1, job))
    with caplog.at_level(logging.WARNING, logger="ml.training_run"):
        log({**message(2, None), "telemetry": broken})
    log(message(3, None))

    (first, step), (second, _), (third, _) = [(m, s) for m, s, _ in tracker.logged]
    assert step == 1 and first["samples_per_s_rank1"] == pytest.approx(500.0)
    assert first["data_wait_fraction"] == pytest.approx(0.15)
    assert first["train_loss"] == 0.7 and first["peak_rss_bytes"] == 300
    assert second == third == {"train_loss": 0.7, "validation_loss": 0.6}
    assert "an epoch's telemetry could not be read, not logged: " in caplog.text
    assert "lacks ['rows']" in caplog.text


def test_a_finished_training_shows_its_telemetry_in_mlflow_and_the_metadata(tmp_path):
    (tmp_path / "run").mkdir()
    plan = plan_training(FLIGHTS, CHOSEN, tmp_path / "set.parquet", tmp_path / "run", LINK)
    epochs = [
        JobEpoch(e, tuple(replace(figures(r, 1000, 2.0, 0.2, 300 + r), epoch=e) for r in (0, 1)))
        for e in (1, 2)
    ]
    tracker = FakeTracker()

    outcome = trained_run(
        plan, reported(telemetry=[e.to_message() for e in epochs]), tracker, 0o640
    )

    logged: list[EpochMetrics] = tracker.finished["epochs"]
    assert [e.epoch for e in logged] == [1, 2]
    assert logged[1].values["samples_per_s_rank1"] == pytest.approx(500.0)
    assert logged[1].values["validation_loss"] == 0.512345678
    assert [Path(f).name for f in tracker.finished["files"]][-2:] == [
        "loss_curve.png",
        "telemetry.png",
    ]
    plot = tmp_path / "run" / "telemetry.png"
    assert plot.read_bytes() == outcome.telemetry_plot and plot.stat().st_mode & 0o777 == 0o640
    metadata = outcome.metadata()
    assert metadata["epoch_telemetry"].count("\n") == 3  # head, rule, two epochs
    assert metadata["peak_rss_bytes"] == 301
    assert metadata["data_wait_fraction"] == pytest.approx(0.1)
    assert metadata["telemetry_plot"].startswith("![samples/s, data wait and memory per epoch]")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_wait_is_the_devices_time_in_the_iterator_without_a_sync_per_step():
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    square = torch.randn(4096, 4096, device=device)

    def busy() -> torch.Tensor:
        return square @ square  # a few ms of the GPU's time, queued on its stream

    def loaded(work: bool) -> Iterator[torch.Tensor]:
        for _ in range(20):
            yield busy() if work else square

    meter = EpochMeter(0, device)
    for _ in meter.timed(loaded(work=True)):
        meter.step(10)
    slow_data = meter.close(1)
    for _ in meter.timed(loaded(work=False)):
        busy()
        meter.step(10)
    slow_steps = meter.close(2)

    assert slow_data.data_wait_fraction > 0.8 > 0.2 > slow_steps.data_wait_fraction
    assert slow_data.device == "cuda" and slow_data.rows == 200
    assert slow_data.memory_reserved_bytes is not None
    assert slow_data.memory_reserved_bytes >= slow_data.memory_bytes > 0
    assert slow_data.peak_memory_bytes >= slow_data.memory_bytes
