from __future__ import annotations

import signal

from ferry._signals import signal_name


def test_a_signal_is_named_as_the_system_names_it() -> None:
    assert signal_name(signal.SIGSEGV) == "SIGSEGV"
    assert signal_name(int(signal.SIGKILL)) == "SIGKILL"


def test_a_number_the_system_does_not_name_stays_a_number() -> None:
    assert signal_name(250) == "signal 250"
