"""Who is calling: the identity every routing decision starts from.

Validation happens here, at the boundary, so that everything downstream (the
sandbox-ID hash, the store keys, Kubernetes annotations, log lines) can trust
its inputs. The rules are deliberately narrow: non-empty user and session, at
most 256 characters, no control characters and no bidirectional overrides. Errors name the field so an API or
CLI can tell the caller exactly what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_FIELD_LENGTH = 256

# C0 and C1 control characters plus DEL. Unicode line/paragraph separators are
# included because they split log lines and HTTP header values just the same.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Bidirectional controls ("Trojan Source", CVE-2021-42574): "\u202eemca" would show as "acme"
# in logs, listings and dashboards. They are Unicode format characters, not controls, so
# they get their own check; other format characters (zero-width joiners in emoji) stay valid.
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Lone surrogates (JSON "\\ud800", or an invalid UTF-8 header byte decoded with
# surrogateescape) cannot be encoded to UTF-8, so they could never be hashed.
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidIdentity(ValueError):
    """An identity field failed validation; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def _check(field: str, value: object, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise InvalidIdentity(field, "is required")
        return None
    if not isinstance(value, str):
        raise InvalidIdentity(field, "must be a string")
    if required and value == "":
        raise InvalidIdentity(field, "must not be empty")
    if len(value) > MAX_FIELD_LENGTH:
        raise InvalidIdentity(field, f"must be at most {MAX_FIELD_LENGTH} characters (got {len(value)})")
    if _CONTROL.search(value):
        raise InvalidIdentity(field, "must not contain control characters")
    if _BIDI.search(value):
        raise InvalidIdentity(field, "must not contain bidirectional text controls (U+202A-202E, U+2066-2069 ...)")
    if _SURROGATE.search(value):
        raise InvalidIdentity(field, "must be valid UTF-8 (found a lone surrogate)")
    return value


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller: ``org_id`` is None for personal accounts, ``bot_id`` is optional.

    Construct through :meth:`parse` at every boundary; the plain constructor
    trusts its arguments (it is used by code that has already validated).
    """

    user_id: str
    session_id: str
    org_id: str | None = None
    bot_id: str | None = None

    @classmethod
    def parse(
        cls,
        *,
        user_id: object,
        session_id: object,
        org_id: object = None,
        bot_id: object = None,
    ) -> Identity:
        """Validate raw values (from JSON, headers, flags) into an Identity.

        An empty optional field is treated as absent for ``bot_id`` only: Kilo's
        prefix rule is a truthiness check on the bot, while ``org_id`` keeps the
        None/empty distinction (an empty org is an org segment ``""``).
        """
        user = _check("user_id", user_id, required=True)
        session = _check("session_id", session_id, required=True)
        org = _check("org_id", org_id, required=False)
        bot = _check("bot_id", bot_id, required=False)
        assert user is not None and session is not None
        return cls(user_id=user, session_id=session, org_id=org, bot_id=bot or None)

    def owner_key(self) -> tuple[str | None, str, str | None]:
        """What a binding's owner is compared against: everything but the session."""
        return (self.org_id, self.user_id, self.bot_id)
