"""The set of declarations every sluicegate process loads, validated as a whole."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator

from sluicegate.config import Settings
from sluicegate.declare import validation
from sluicegate.declare.errors import DeclarationError
from sluicegate.declare.workflow import Workflow


class App:
    """`App([wf, ...], settings=...)`: checks every workflow and the rules across them, and
    raises one DeclarationError listing every problem. `settings` None reads the process's
    settings (environment variables), which is what says whether an encryption key exists."""

    def __init__(self, workflows: Iterable[Workflow], *, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings()
        listed = list(workflows)
        problems: list[str] = []
        valid: list[Workflow] = []
        for position, wf in enumerate(listed):
            if not isinstance(wf, Workflow):
                problems.append(f"item {position} of the app is a {type(wf).__name__}, "
                                "not a Workflow")
                continue
            problems.extend(wf.problems)
            if wf.valid:
                valid.append(wf)
        problems += validation.check_app(
            valid, encryption_configured=bool(self.settings.encryption_keys.strip())
        )
        if problems:
            raise DeclarationError(dict.fromkeys(problems))
        self.workflows: dict[str, Workflow] = {wf.name: wf for wf in valid}

    def with_settings(self, settings: Settings) -> App:
        """The same workflows judged against other settings."""
        return App(self.workflows.values(), settings=settings)

    def get(self, name: str) -> Workflow | None:
        return self.workflows.get(name)

    def __getitem__(self, name: str) -> Workflow:
        return self.workflows[name]

    def __contains__(self, name: object) -> bool:
        return name in self.workflows

    def __iter__(self) -> Iterator[Workflow]:
        return iter(self.workflows.values())

    def __len__(self) -> int:
        return len(self.workflows)

    def __repr__(self) -> str:
        return f"App({sorted(self.workflows)})"


def load_app(target: str, settings: Settings | None = None) -> App:
    """Import `module` (or `module:attr`; the attribute defaults to `app`) and return its
    App. Problems in the declarations raise DeclarationError as the module builds its App; a
    module that cannot be imported, or has no App there, raises DeclarationError saying so.
    With `settings`, the App is judged again against them (the module built it with the
    environment's), so a missing encryption key is caught for the process that runs it."""
    module_name, _, attr = target.partition(":")
    attr = attr or "app"
    try:
        module = importlib.import_module(module_name)
    except DeclarationError:
        raise
    except ImportError as exc:
        raise DeclarationError([f"declarations {target!r}: cannot import {module_name!r}: {exc}"]
                               ) from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        found = "nothing" if app is None else f"a {type(app).__name__}"
        raise DeclarationError([f"declarations {target!r}: {module_name}.{attr} is {found}, "
                                "not a sluicegate App"])
    if settings is not None and settings != app.settings:
        return app.with_settings(settings)
    return app
