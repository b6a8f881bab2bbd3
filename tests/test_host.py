"""`trl_ext.host`: the one reader of a log's tail (the launcher's, the weight-sync client's and the watchdog's
messages all quote it)."""

from trl_ext.host import log_tail


def test_log_tail_gives_the_last_lines_as_written(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"one\ntwo\nthree\xff\nfour\nfive\n")
    assert log_tail(log, 2) == "four\nfive"
    assert log_tail(str(log), 3) == "three\ufffd\nfour\nfive"  # an undecodable byte is replaced, not raised
    assert log_tail(log, 10) == "one\ntwo\nthree\ufffd\nfour\nfive"


def test_log_tail_without_a_readable_log():
    assert log_tail(None, 5) == ""
    assert log_tail("/nonexistent/server.log", 5) == "(the log cannot be read)"


def test_log_tail_shows_a_progress_bar_line_as_a_terminal_does(tmp_path):
    """A line a progress bar rewrote with carriage returns (tqdm) is its last version; Windows line ends are ends."""
    log = tmp_path / "run.log"
    log.write_bytes(b"start\r\n 10%|#  | 1/10\r 20%|## | 2/10\r 30%|###| 3/10\nerror: boom\n")
    assert log_tail(log, 3) == "start\n 30%|###| 3/10\nerror: boom"
