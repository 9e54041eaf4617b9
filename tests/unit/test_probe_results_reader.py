"""The probes' results file is read while the probes' pytest appends to it."""

from __future__ import annotations

from gpuprov.probes.run import complete_lines


def test_a_line_still_being_written_is_left_for_the_next_read() -> None:
    assert complete_lines("") == []
    assert complete_lines('{"host": "a"}\n{"host"') == ['{"host": "a"}']
    assert complete_lines('{"host": "a"}\n{"host": "b"}\n') == ['{"host": "a"}', '{"host": "b"}']
