"""Fails on purpose; run only by test_failure_logs.py to prove failures carry the component logs."""

from tests.e2e.cluster import ControlPlane


def test_fails_on_purpose(control_plane: ControlPlane) -> None:
    assert control_plane.get("nodes")["items"] == [], "deliberate failure"
