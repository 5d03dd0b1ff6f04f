"""What a run prints while it trains: one line per epoch, and the time
left estimated without the first epoch's compilation."""

import io
import re
import sys

import pytest

from _tiny import tiny_overrides
from keras_attn.zoo import runs

pytestmark = pytest.mark.backend_independent


def test_time_left_leaves_out_the_first_epoch_once_another_is_timed():
    # Epoch 0 of this process took 60 s (compilation), the next ones 10 s.
    assert runs.time_left(3, {"0": 60.0}, first="0") == 180.0  # nothing better yet
    assert runs.time_left(3, {"0": 60.0, "1": 10.0, "2": 12.0}, first="0") == 33.0
    # Resumed at epoch 2: the earlier process's epochs count, this one's first not.
    assert runs.time_left(2, {"0": 60.0, "1": 10.0, "2": 50.0, "3": 14.0}, first="2") == (
        2 * (60.0 + 10.0 + 14.0) / 3)


def test_after_the_first_epoch_the_time_left_leaves_out_its_first_step(tmp_path, monkeypatch,
                                                                      capsys):
    """Only the first epoch timed: its first step (600 s of compilation here)
    does not count; the other steps' pace (60 s) stands for it."""
    clock = iter([0.0, 600.0, 660.0, 720.0, 780.0, 790.0])  # begin, 4 steps, end
    monkeypatch.setattr(runs, "time", type("Clock", (), {"time": lambda: next(clock)}))
    logger = runs._epoch_logger(3, 4, str(tmp_path / "times.json"), verbose=2)
    logger.on_epoch_begin(0)
    for batch in range(4):
        logger.on_train_batch_end(batch, {"loss": 1.0})
    logger.on_epoch_end(0, {"loss": 1.0})
    # 2 epochs of 4 steps at 60 s, plus the 10 s after the last step each:
    # 500 s, where the epoch's own 790 s would have said 26.3 min.
    assert "(790.0 s, about 8.3 min left)" in capsys.readouterr().out
    assert runs.time_left(2, {"0": 790.0}, first="0", first_steady=250.0) == 500.0
    # Once a second epoch is timed, the first is left out as before.
    assert runs.time_left(1, {"0": 790.0, "1": 240.0}, first="0", first_steady=250.0) == 240.0


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_progress_line_is_replaced_by_the_epoch_line(tmp_path, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    logger = runs._epoch_logger(2, 3, str(tmp_path / "times.json"), verbose=1)
    logger.on_epoch_begin(0)
    for batch in range(3):
        logger.on_train_batch_end(batch, {"loss": 2.0 - batch})
    logger.on_epoch_end(0, {"loss": 0.5, "val_loss": 0.75})
    text = terminal.getvalue()
    assert "\repoch 1/2: step 3/3 - loss 0" not in text  # each update erases the line first
    assert "\r\x1b[Kepoch 1/2: step 3/3 - loss 0" in text
    # What is left on the screen: the progress line erased, then one line.
    screen = text.rsplit("\r\x1b[K", 1)[1]
    assert re.fullmatch(r"epoch 1/2 \(\d+\.\d s, about \d+\.\d min left\): "
                        r"loss 0\.5 - val_loss 0\.75\n", screen), screen


def test_a_run_prints_one_line_per_epoch_and_no_keras_progress_bar(tmp_path, capfd):
    overrides = tiny_overrides("vit_tiny_digits") + ["training.epochs=2"]
    runs.train("vit_tiny_digits", overrides, output=str(tmp_path / "run"), export=False,
               verbose=1)
    out = capfd.readouterr().out
    epoch_lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split(" (")[0] for line in epoch_lines] == ["epoch 1/2", "epoch 2/2"]
    assert "val_loss" in epoch_lines[0]
    # The time left is given while epochs are left, not after the last one.
    assert "min left" in epoch_lines[0] and "left" not in epoch_lines[1]
    # Keras's bar (its "━" blocks and per-step timing) is not shown: output
    # is not a terminal here, and the epoch line says what it would.
    assert "━" not in out and "/step" not in out
