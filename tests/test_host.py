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
