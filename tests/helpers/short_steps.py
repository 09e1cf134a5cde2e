"""Which steps a decoder ran natively (models/short_path.py): a spy on `ShortPath.run`."""

from __future__ import annotations

import pytest

from embedserve.models.short_path import ShortPath


def record_short_steps(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that gets, per step from now on, whether the native short path took it."""
    taken: list[bool] = []
    run = ShortPath.run

    def spy(self: ShortPath, *args: object) -> bool:
        taken.append(run(self, *args))  # type: ignore[arg-type]
        return taken[-1]

    monkeypatch.setattr(ShortPath, "run", spy)
    return taken
