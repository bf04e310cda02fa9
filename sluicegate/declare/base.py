"""The base of every declaration model: construction never raises, it records problems.

A declarations module builds options before the workflow that holds them
(`Workflow(concurrency=Concurrency(limit="five"))`). If the option raised, the import would
stop at the first mistake, with no workflow name in the message. Instead a model that does
not validate is kept, unvalidated, with its problems; the Workflow prefixes them with its
name, and App raises one DeclarationError listing every problem of every workflow.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError


class Declared(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, populate_by_name=True
    )

    # How messages name this model: "debounce", "concurrency", ...
    option_name: ClassVar[str] = ""

    _problems: list[str] = PrivateAttr(default_factory=list)
    _valid: bool = PrivateAttr(default=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            _keep_unvalidated(self, data)
            self._valid = False
            self._problems.extend(pydantic_problems(self.option_name, exc))

    @property
    def problems(self) -> tuple[str, ...]:
        """What is wrong with this declaration, each message naming the option and field."""
        return tuple(self._problems)

    @property
    def valid(self) -> bool:
        """Whether it passed type validation (range and cross-option rules come later)."""
        return self._valid


def pydantic_problems(option: str, exc: ValidationError) -> list[str]:
    """`concurrency limit: Input should be a valid integer` from a pydantic error."""
    out = []
    for error in exc.errors(include_url=False):
        # List positions are left out: `concurrency limit` reads better than `concurrency 0 limit`.
        where = " ".join(str(part) for part in error["loc"] if not isinstance(part, int))
        where = " ".join(part for part in (option, where) if part)
        message = error["msg"]
        if error["type"] == "value_error" and "error" in error.get("ctx", {}):
            message = str(error["ctx"]["error"])  # our own text, without "Value error, "
        out.append(f"{where}: {message}" if where else message)
    return out


def _keep_unvalidated(model: BaseModel, data: dict[str, Any]) -> None:
    """Fill `model` with the raw values, as pydantic's model_construct would, but without
    running model_post_init (which assumes validated values)."""
    cls = type(model)
    values: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if field.alias is not None and field.alias in data:
            values[name] = data[field.alias]
        elif name in data:
            values[name] = data[name]
        elif not field.is_required():
            values[name] = field.get_default(call_default_factory=True, validated_data=values)
        else:
            values[name] = None
    object.__setattr__(model, "__dict__", values)
    object.__setattr__(model, "__pydantic_fields_set__", set(data) & set(values))
    object.__setattr__(model, "__pydantic_extra__", None)
    private = {
        name: attr.get_default(call_default_factory=True)
        for name, attr in cls.__private_attributes__.items()
    }
    object.__setattr__(model, "__pydantic_private__", private)
