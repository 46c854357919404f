"""Parties that share a kernel cache (one host) warm up one at a time: the others wait for the
first, saying so in their log, and then load what it compiled (net.party.server)."""
import fcntl
import logging
import threading

from net.party.server import _one_compiler


def test_a_party_waits_for_the_one_compiling_into_its_cache(tmp_path, caplog):
    entered = threading.Event()

    def second_party():
        with _one_compiler(tmp_path):
            entered.set()

    with open(tmp_path / "mpc3-warmup.lock", "a") as first, \
            caplog.at_level(logging.INFO, logger="mpc3.server"):
        fcntl.flock(first, fcntl.LOCK_EX)            # the first party, compiling
        t = threading.Thread(target=second_party)
        t.start()
        assert not entered.wait(0.5)
        assert "another process is compiling the kernels" in caplog.text
        fcntl.flock(first, fcntl.LOCK_UN)
        assert entered.wait(10)
    t.join()


def test_no_lock_where_none_can_be_made(tmp_path):
    (tmp_path / "file").write_text("")
    with _one_compiler(tmp_path / "file" / "cache"):     # cannot be a directory: no lock
        pass
