"""The one error a declaration load raises: every problem found, together."""

from __future__ import annotations

from collections.abc import Iterable


class DeclarationError(Exception):
    """Declarations that cannot be loaded. `problems` lists every problem found, one message
    each, in the form `workflow f: throttle period must be between 1s and 7d`; the text of
    the error is those messages, one per line, so a boot log shows all of them at once."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__("\n".join(self.problems))
