"""pydantic's validation errors as one line that names each bad field and its limit.

pydantic's own message takes four lines a problem (model name, field, message with type codes, a link). The
offline API (``SamplingParams``, ``LLM``'s engine arguments) raises ``InvalidArgument`` instead, one line:
``temperature: must be >= 0.0 (got -1)``. The CLI writes the same problems with flag names.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from pydantic import BaseModel, ValidationError

_LIMITS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


class InvalidArgument(ValueError):
    """Bad values, as ``(field, message)`` pairs (field "" for a check across fields, whose message names them);
    ``param`` is the first field: a check across fields counts as the one its message starts with, when that is
    one of ``fields`` (``min_tokens (5) must be <= max_tokens (3)``: min_tokens). ``str()`` is one line:
    ``'field: message; ...'``."""

    def __init__(self, problems: list[tuple[str, str]], fields: Collection[str] = ()) -> None:
        self.problems = problems
        named = (field or _leading_field(message, fields) for field, message in problems)
        self.param = next((name for name in named if name), None)
        super().__init__("; ".join(message if _names(message, field) else f"{field}: {message}" for field, message in problems))

    @classmethod
    def from_pydantic(cls, error: ValidationError, renamed: dict[str, str] | None = None, within: str = "",
                      fields: Collection[str] = ()) -> InvalidArgument:
        """One problem per pydantic error. ``renamed`` maps a model's field to the name its caller knows it by
        (a config's ``cache_dtype`` is the engine argument ``kv_cache_dtype``); ``within`` names the argument the
        model is the value of (``eplb_config``); ``fields``: the model's, for ``param``."""
        problems = []
        for item in error.errors():
            field = [str(part) for part in item.get("loc", ())]
            if field:
                field[0] = (renamed or {}).get(field[0], field[0])
            ctx = item.get("ctx") or {}
            limits = [f"{op} {ctx[key]}" for key, op in _LIMITS if key in ctx]
            if item.get("type") == "extra_forbidden":
                message = "is not an argument raygrid knows"
            elif limits:
                message = "must be " + " and ".join(limits)
            else:
                message = item.get("msg", "is invalid").removeprefix("Value error, ")
                if field and item.get("type") != "value_error":  # pydantic's own 'Input should be ...'
                    message = message[:1].lower() + message[1:]
            if field and "input" in item and item.get("type") not in ("extra_forbidden", "value_error"):  # a check's message says
                message += f" (got {_short(item['input'])})"
            problems.append((".".join(([within] if within else []) + field), message))
        return cls(problems, fields)


class OneLineErrors(BaseModel):
    """A pydantic model whose construction raises ``InvalidArgument`` rather than pydantic's ValidationError."""

    def __init__(self, **fields) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as error:
            raise InvalidArgument.from_pydantic(error, fields=type(self).model_fields) from None


def _names(message: str, field: str) -> bool:
    """Whether the message already starts with the field's name (a validator's 'stop_token_ids must be >= 0')."""
    return not field or message.startswith(field.rsplit(".", 1)[-1])


def _leading_field(message: str, fields: Collection[str]) -> str:
    """The field a check across fields faults: its message's first word, where that is one of ``fields``."""
    word = re.match(r"[A-Za-z_]\w*", message)
    return word.group(0) if word and word.group(0) in fields else ""


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
