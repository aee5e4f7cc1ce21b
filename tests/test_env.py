"""Solo's environment knobs: every value is read or refused by name, never taken silently as the default."""

from __future__ import annotations

import pytest

from solo.env import EnvSettingError, env_choice, env_int, env_switch
from solo.errors import SoloError


@pytest.mark.parametrize(("value", "expected"), [
    ("1", True), ("0", False), (" off ", False), ("FALSE", False), ("no", False), ("On", True), ("yes", True),
    ("", True), ("  ", True),  # empty: the default
])
def test_switches_take_the_usual_spellings(monkeypatch, value, expected):
    # SOLO_CPU_INT_DOT=off, SOLO_CPU_ADAPT_THREADS=false and SOLO_PAUSE_STEPS=no left the feature on: only "0" was off.
    monkeypatch.setenv("SOLO_TEST_SWITCH", value)
    assert env_switch("SOLO_TEST_SWITCH", True) is expected


def test_bad_values_are_refused_by_name(monkeypatch):
    monkeypatch.delenv("SOLO_TEST_SWITCH", raising=False)
    assert env_switch("SOLO_TEST_SWITCH", False) is False
    for value in ("2", "disable", "o n"):
        monkeypatch.setenv("SOLO_TEST_SWITCH", value)
        with pytest.raises(EnvSettingError, match=f"SOLO_TEST_SWITCH='{value}' is not a switch: set it to 1 or 0"):
            env_switch("SOLO_TEST_SWITCH", True)
    monkeypatch.setenv("SOLO_TEST_CHOICE", " Before ")
    assert env_choice("SOLO_TEST_CHOICE", ("step", "before"), "step") == "before"
    monkeypatch.setenv("SOLO_TEST_CHOICE", "garbage")
    with pytest.raises(EnvSettingError, match="SOLO_TEST_CHOICE='garbage' is not one of step, before"):
        env_choice("SOLO_TEST_CHOICE", ("step", "before"), "step")
    for value, expected in (("", 7), (" 12 ", 12), ("0", 0)):
        monkeypatch.setenv("SOLO_TEST_INT", value)
        assert env_int("SOLO_TEST_INT", 7, 0, 100) == expected
    for value in ("abc", "101", "-1", "1e3", "\u00b2", "--5", "+-5"):
        monkeypatch.setenv("SOLO_TEST_INT", value)
        with pytest.raises(EnvSettingError, match="is not a whole number from 0 to 100 us"):
            env_int("SOLO_TEST_INT", 7, 0, 100, "us")
    assert issubclass(EnvSettingError, SoloError)  # the command line prints it as one line
