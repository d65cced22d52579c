"""Placeholder replaced below."""


def ensure_calibrated() -> None:
    return None
