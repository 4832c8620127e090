"""Training progress a user can read anywhere: a line at a regular cadence in a pipe or a CI log,
a labelled time left that moves with the mean update time (not each update's own), and after
Ctrl-C the exact command that continues the run — which the test then runs."""

from __future__ import annotations

import shlex

import pytest
import torch

from dohnuts.cli import main
from dohnuts.train.progress import TrainingProgress, UpdateClock, duration


def test_duration_in_words():
    assert [duration(s) for s in (0, 42, 60, 307, 3599, 3600, 3720)] == [
        "0 s", "42 s", "1 min 0 s", "5 min 7 s", "59 min 59 s", "1 h 00 min", "1 h 02 min"]


def test_the_time_left_is_the_mean_update_time_over_the_run():
    clock = UpdateClock(total=100, completed=0)
    clock.tick(1, now=10.0)  # the first update this process ran: its own warm-up, no mean yet
    assert clock.seconds_per_update() is None and clock.seconds_left() is None
    clock.tick(2, now=12.0)
    clock.tick(3, now=14.0)
    clock.tick(4, now=30.0)  # an evaluation came with this one
    assert clock.seconds_per_update() == pytest.approx(20.0 / 3)
    assert clock.seconds_left() == pytest.approx(20.0 / 3 * 96)


def test_the_time_left_does_not_jump_with_one_update():
    """Updates alternating 1 s and 10 s: each update's own pace would make the time left swing
    tenfold between two updates (189 s ↔ 1,890 s); the mean's estimate moves by under 10 % from
    the tenth update on, and under 2 % over the last twenty."""
    clock = UpdateClock(total=200, completed=0)
    now, lefts = 0.0, []
    for u in range(1, 101):
        now += 1.0 if u % 2 else 10.0
        clock.tick(u, now=now)
        if u >= 10:
            lefts.append(clock.seconds_left())
    ratios = [b / a for a, b in zip(lefts, lefts[1:])]
    assert all(0.9 < r < 1.1 for r in ratios), (min(ratios), max(ratios))
    assert all(0.98 < r < 1.02 for r in ratios[-20:])


def test_a_resumed_run_counts_from_its_own_first_update():
    clock = UpdateClock(total=50, completed=40)
    clock.tick(41, now=100.0)
    clock.tick(43, now=104.0)
    assert clock.seconds_per_update() == pytest.approx(2.0) and clock.seconds_left() == pytest.approx(14.0)


def test_in_a_pipe_a_line_at_the_first_update_then_every_interval_and_at_the_end():
    lines: list[str] = []
    with TrainingProgress(100, 0, terminal=False, every_s=30.0, write=lines.append) as progress:
        for u in range(1, 101):
            progress.update(u, 0.5, now=float(u))  # one update a second
    assert lines[0] == "dohnuts: update 1 of 100, loss 0.500"  # no pace yet: one update is no mean
    assert lines[1] == "dohnuts: update 31 of 100, loss 0.500, 1.00 s/update, about 1 min 9 s left"
    assert [line.split(",")[0] for line in lines] == [f"dohnuts: update {u} of 100" for u in (1, 31, 61, 91, 100)]
    assert lines[-1].endswith("about 0 s left")


def test_disabled_progress_says_nothing():
    lines: list[str] = []
    with TrainingProgress(10, 0, enabled=False, terminal=False, write=lines.append) as progress:
        for u in range(1, 11):
            progress.update(u, 0.5, now=float(u))
    assert lines == []


def test_the_terminal_bar_labels_its_pace():
    progress = TrainingProgress(10, 0, terminal=True)
    progress.update(1, 0.7, now=0.0)
    assert progress.pace() == ""
    progress.update(3, 0.6, now=5.0)
    assert progress.pace() == "2.50 s/update · about 18 s left"


@pytest.fixture
def restore_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_ctrl_c_says_how_to_resume_and_that_command_continues_the_run(tmp_path, capsys, restore_threads):
    run = tmp_path / "my run"  # a space: the command must quote it
    base = ["train", "--model", "tiny", "--device", "cpu", "--out", str(run), "--synthetic-train", "8",
            "--eval-every", "2", "--lora-rank", "2", "--updates", "4"]

    def ctrl_c_at_update_3(world, update):
        if update == 3:
            raise KeyboardInterrupt

    assert main(base, after_update=ctrl_c_at_update_3) == 130
    err = capsys.readouterr().err
    assert "dohnuts: update 1 of 4, loss" in err  # progress in a pipe (capsys is not a terminal)
    (line,) = [x for x in err.splitlines() if x.startswith("dohnuts: interrupted")]
    prefix = "dohnuts: interrupted; the checkpoint of update 2 is intact — continue with: "
    assert line.startswith(prefix), line
    command = shlex.split(line[len(prefix):])
    assert command == ["dohnuts", "train", "--out", str(run), "--resume", "--device", "cpu"]
    assert main(command[1:]) == 0
    err = capsys.readouterr().err
    assert "resumed at update 2" in err and "dohnuts: update 4 of 4, loss" in err
    assert (run / "summary.json").is_file()


def test_ctrl_c_before_any_checkpoint_says_there_is_nothing_to_resume(tmp_path, capsys, monkeypatch):
    import dohnuts.train.command as command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_train", interrupted)  # Ctrl-C while the model loads
    assert main(["train", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err.strip() == ("dohnuts: interrupted; no checkpoint was committed: nothing to resume, "
                                               "run the command again")


def test_predict_s_bar_labels_its_time_left_and_smooths_it():
    from rich.progress import TextColumn, TimeRemainingColumn

    from dohnuts.cli import _progress

    bar = _progress()
    kinds = [type(c) for c in bar.columns]
    at = kinds.index(TimeRemainingColumn)
    assert isinstance(bar.columns[at - 1], TextColumn) and bar.columns[at - 1].text_format == "left"
    assert bar.speed_estimate_period >= 3600  # rich's default, 30 s, follows each request's own time
