"""The one exception type for bad user input: :class:`InputError` (see :mod:`seeupo.validation`)."""

from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """Bad user input; ``str(err)`` is one line: ``[SOURCE: ]field 'FIELD': MESSAGE``.

    ``source`` is the file (or ``None``); ``field`` the field or flag at fault (or ``None``
    when the problem is the file as a whole).
    """

    def __init__(self, field: str | None, message: str, source: str | None = None) -> None:
        self.field, self.message, self.source = field, message, source
        super().__init__(self._text())

    def _text(self) -> str:
        text = self.message if self.field is None else f"field '{self.field}': {self.message}"
        return text if self.source is None else f"{self.source}: {text}"

    def in_file(self, source: str | Path) -> "InputError":
        """This error attributed to ``source`` (unless it already names a file)."""
        if self.source is None:
            self.source = str(source)
            self.args = (self._text(),)
        return self

    def from_source(self, source: str) -> "InputError":
        """This error attributed to ``source`` instead of the file it named (a ``--set`` flag)."""
        self.source = source
        self.args = (self._text(),)
        return self

    def inside(self, prefix: str) -> "InputError":
        """This error with its field prefixed by an enclosing field: ``instance.rewards``."""
        self.field = prefix if self.field is None else f"{prefix}.{self.field}"
        self.args = (self._text(),)
        return self
