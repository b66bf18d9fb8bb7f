"""Sandbox IDs and identities: byte-compatible with Kilo cloud-agent-next (PR #1147).

The first half re-expresses every case of Kilo's ``sandbox-id.test.ts`` (named
``kilo: ...``), the second our extensions from ARCHITECTURE.md ("Sandbox IDs"),
then property tests against an independent reference implementation written
from the spec with hashlib, and finally ``Identity.parse`` validation.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import (
    Identity,
    InvalidIdentity,
    default_policy,
    is_valid_sandbox_id,
    parse_org_list,
    per_session_sandbox_id,
    place,
    pool_for,
    sandbox_id_prefix,
    shared_sandbox_id,
)
from routing.ids import is_per_session_org

RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# Vectors from ARCHITECTURE.md (computed by Kilo's TypeScript implementation).
VEC_ORG = "9d278969-5453-4ae3-a51f-a8d2274a7b56"
VEC_USER = "fd93a81c-63c2-4d14-84b3-60d6ac3b592f"
VEC_SHARED_ID = "org-af3bd288e383e28dca86f85c8a3b604bced4023b4c00f150"
VEC_SES_ID = "ses-51256c9fcd04ef0144d0afcdfb9ffb2abc280ff2e0bae370"

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)


def reference_shared_id(org_id: str | None, user_id: str, bot_id: str | None) -> str:
    """ARCHITECTURE.md's rule, written independently of routing.ids."""
    segment = org_id if org_id is not None else "user:" + user_id
    hashed = f"{segment}__{user_id}__bot:{bot_id}" if bot_id else f"{segment}__{user_id}"
    if bot_id:
        prefix = "bot" if org_id else "ubt"
    else:
        prefix = "org" if org_id else "usr"
    return prefix + "-" + hashlib.sha256(hashed.encode("utf-8")).hexdigest()[:48]


def reference_session_id(session_id: str) -> str:
    return "ses-" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:48]


def assert_well_formed(sandbox_id: str) -> None:
    assert len(sandbox_id) == 52
    assert len(sandbox_id) <= 63
    assert RFC1035_LABEL.fullmatch(sandbox_id), sandbox_id


# --------------------------------------------------------------------------------------
# Kilo sandbox-id.test.ts: generateSandboxId
# --------------------------------------------------------------------------------------


def test_kilo_length_is_52_and_fits_a_63_char_label() -> None:
    sandbox_id = shared_sandbox_id(VEC_ORG, VEC_USER)
    assert len(sandbox_id) == 52
    assert len(sandbox_id) <= 63


def test_kilo_long_inputs_still_give_52_chars() -> None:
    assert len(shared_sandbox_id("a" * 36, "b" * 36, "c" * 50)) == 52


@pytest.mark.parametrize(
    "bot_id",
    [pytest.param(None, id="kilo: deterministic without bot"), pytest.param("reviewer", id="kilo: deterministic with bot")],
)
def test_kilo_deterministic(bot_id: str | None) -> None:
    assert shared_sandbox_id("org-id", "user-id", bot_id) == shared_sandbox_id("org-id", "user-id", bot_id)


@pytest.mark.parametrize(
    ("org_id", "bot_id", "prefix"),
    [
        pytest.param("org-id", None, "org", id="kilo: org account -> org-"),
        pytest.param(None, None, "usr", id="kilo: personal account -> usr-"),
        pytest.param("org-id", "reviewer", "bot", id="kilo: bot in org -> bot-"),
        pytest.param(None, "reviewer", "ubt", id="kilo: bot of personal account -> ubt-"),
    ],
)
def test_kilo_prefixes(org_id: str | None, bot_id: str | None, prefix: str) -> None:
    sandbox_id = shared_sandbox_id(org_id, "user-id", bot_id)
    assert sandbox_id.startswith(prefix + "-")
    assert sandbox_id_prefix(sandbox_id) == prefix
    assert_well_formed(sandbox_id)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(("org-1", "user-id", None), ("org-2", "user-id", None), id="kilo: unique across orgIds"),
        pytest.param(("org-id", "user-1", None), ("org-id", "user-2", None), id="kilo: unique across userIds"),
        pytest.param(("org-id", "user-id", "bot-1"), ("org-id", "user-id", "bot-2"), id="kilo: unique across botIds"),
        pytest.param(("org-id", "user-id", None), (None, "user-id", None), id="kilo: org vs personal differ"),
        pytest.param(("org-id", "user-id", None), ("org-id", "user-id", "reviewer"), id="kilo: with vs without bot differ"),
    ],
)
def test_kilo_uniqueness(a: tuple[str | None, str, str | None], b: tuple[str | None, str, str | None]) -> None:
    assert shared_sandbox_id(*a) != shared_sandbox_id(*b)


def test_kilo_special_characters() -> None:
    sandbox_id = shared_sandbox_id("org@123", "user#456", "bot$789")
    assert sandbox_id.startswith("bot-")
    assert_well_formed(sandbox_id)
    assert sandbox_id == reference_shared_id("org@123", "user#456", "bot$789")


def test_kilo_empty_strings() -> None:
    sandbox_id = shared_sandbox_id("", "", "")
    assert len(sandbox_id) == 52
    # Prefix by truthiness: empty org and empty bot -> "usr". The hashed segment keeps
    # the empty org (a None check), so the hashed string is "" + "__" + "" = "__", not
    # "user:__" (which a truthiness check on the segment would give).
    assert sandbox_id == "usr-" + hashlib.sha256(b"__").hexdigest()[:48]
    assert sandbox_id != "usr-" + hashlib.sha256(b"user:__").hexdigest()[:48]


def test_kilo_unicode() -> None:
    sandbox_id = shared_sandbox_id("org-日本", "user-한국", "bot-中国")
    assert_well_formed(sandbox_id)
    assert sandbox_id == reference_shared_id("org-日本", "user-한국", "bot-中国")


# --------------------------------------------------------------------------------------
# Kilo sandbox-id.test.ts: generatePerSessionSandboxId
# --------------------------------------------------------------------------------------


def test_kilo_per_session_id_shape() -> None:
    sandbox_id = per_session_sandbox_id("agent_abc123")
    assert sandbox_id.startswith("ses-")
    assert_well_formed(sandbox_id)


def test_kilo_per_session_deterministic() -> None:
    assert per_session_sandbox_id("agent_abc123") == per_session_sandbox_id("agent_abc123")


def test_kilo_per_session_different_sessions_differ() -> None:
    assert per_session_sandbox_id("agent_abc123") != per_session_sandbox_id("agent_abc124")


# --------------------------------------------------------------------------------------
# Kilo sandbox-id.test.ts: isPerSessionSandboxOrg (+ our extensions)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "org_id", "expected"),
    [
        pytest.param("org-a,org-b,org-c", "org-b", True, id="kilo: org in comma list"),
        pytest.param("org-a", "org-a", True, id="kilo: single entry"),
        pytest.param(" abc , def ", "abc", True, id="kilo: whitespace trimmed (first)"),
        pytest.param(" abc , def ", "def", True, id="kilo: whitespace trimmed (last)"),
        pytest.param("org-a,org-b", "org-z", False, id="kilo: unknown org"),
        pytest.param("org-a,org-b", None, False, id="kilo: None org"),
        pytest.param("", "org-a", False, id="kilo: empty string list"),
        pytest.param(None, "org-a", False, id="kilo: unset list"),
        pytest.param("*", None, True, id="ext: '*' applies even when org is None"),
        pytest.param("*", "anything", True, id="ext: '*' applies to any org"),
        pytest.param("org-a, * ", "org-z", True, id="ext: '*' anywhere in the list, trimmed"),
        pytest.param(",, ,", "", False, id="ext: only separators -> empty list"),
        pytest.param("org-a", "org-a ", False, id="ext: the org itself is not trimmed"),
    ],
)
def test_per_session_org_list(raw: str | None, org_id: str | None, expected: bool) -> None:
    assert is_per_session_org(parse_org_list(raw), org_id) is expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(None, frozenset(), id="unset"),
        pytest.param("", frozenset(), id="empty"),
        pytest.param(",, ,", frozenset(), id="only separators"),
        pytest.param(" abc , def ", frozenset({"abc", "def"}), id="trimmed"),
        pytest.param("a,,b,a", frozenset({"a", "b"}), id="empties dropped, duplicates merged"),
        pytest.param("*", frozenset({"*"}), id="wildcard"),
    ],
)
def test_parse_org_list(raw: str | None, expected: frozenset[str]) -> None:
    assert parse_org_list(raw) == expected


def test_is_per_session_org_accepts_any_iterable() -> None:
    assert is_per_session_org(["org-a"], "org-a")
    assert is_per_session_org({"*"}, None)
    assert not is_per_session_org((), "org-a")


# --------------------------------------------------------------------------------------
# Kilo sandbox-id.test.ts: getSandboxNamespace -> pool_for
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sandbox_id", "pool"),
    [
        pytest.param(per_session_sandbox_id("s1"), "small", id="kilo: ses- -> small pool"),
        pytest.param(shared_sandbox_id("org-id", "user-id"), "shared", id="kilo: org- -> shared pool"),
        pytest.param(shared_sandbox_id(None, "user-id"), "shared", id="kilo: usr- -> shared pool"),
        pytest.param(shared_sandbox_id("org-id", "user-id", "reviewer"), "shared", id="kilo: bot- -> shared pool"),
        pytest.param(shared_sandbox_id(None, "user-id", "reviewer"), "shared", id="ext: ubt- -> shared pool"),
        pytest.param("org-id__user-id", "shared", id="ext: legacy __ ID -> default pool"),
        pytest.param("ses__legacy", "shared", id="ext: legacy ID starting with ses -> default pool"),
    ],
)
def test_pool_for_default_policy(sandbox_id: str, pool: str) -> None:
    assert pool_for(sandbox_id, default_policy()) == pool


# --------------------------------------------------------------------------------------
# Extensions: vectors, validity
# --------------------------------------------------------------------------------------


def test_vector_shared_org() -> None:
    assert shared_sandbox_id(VEC_ORG, VEC_USER) == VEC_SHARED_ID
    placement = place(Identity(org_id=VEC_ORG, user_id=VEC_USER, session_id="agent_session-1"), default_policy())
    assert placement.sandbox_id == VEC_SHARED_ID
    assert placement.pool == "shared"


def test_vector_per_session() -> None:
    assert per_session_sandbox_id("agent_abc123") == VEC_SES_ID
    policy = default_policy(parse_org_list("my-org"))
    placement = place(Identity(org_id="my-org", user_id="user-id", session_id="agent_abc123"), policy)
    assert placement.sandbox_id == VEC_SES_ID
    assert placement.pool == "small"


def test_vectors_match_reference() -> None:
    assert reference_shared_id(VEC_ORG, VEC_USER, None) == VEC_SHARED_ID
    assert reference_session_id("agent_abc123") == VEC_SES_ID


def test_wildcard_makes_personal_accounts_per_session() -> None:
    policy = default_policy(parse_org_list("*"))
    placement = place(Identity(org_id=None, user_id="u", session_id="s"), policy)
    assert placement.sandbox_id == per_session_sandbox_id("s")
    assert placement.pool == "small"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        pytest.param(per_session_sandbox_id("s"), True, id="generated ses"),
        pytest.param(shared_sandbox_id("o", "u"), True, id="generated org"),
        pytest.param(shared_sandbox_id(None, "u"), True, id="generated usr"),
        pytest.param(shared_sandbox_id("o", "u", "b"), True, id="generated bot"),
        pytest.param(shared_sandbox_id(None, "u", "b"), True, id="generated ubt"),
        pytest.param("org-0123456789abcdef", True, id="short hex is valid"),
        pytest.param("org-id__user-id", True, id="legacy __ ID"),
        pytest.param("user:u__u__bot:b", True, id="legacy personal bot ID"),
        pytest.param("ORG-" + "a" * 48, False, id="uppercase prefix"),
        pytest.param("org-" + "A" * 48, False, id="uppercase hex"),
        pytest.param("abc-" + "a" * 48, False, id="wrong prefix"),
        pytest.param("sess-" + "a" * 48, False, id="prefix too long"),
        pytest.param("org_" + "a" * 48, False, id="underscore instead of dash"),
        pytest.param("org-", False, id="no hash"),
        pytest.param("org-xyz", False, id="non-hex"),
        pytest.param("org-" + "a" * 48 + "\n", False, id="trailing newline"),
        pytest.param(" org-" + "a" * 48, False, id="leading space"),
        pytest.param("", False, id="empty"),
        pytest.param("_", False, id="single underscore"),
    ],
)
def test_is_valid_sandbox_id(value: str, valid: bool) -> None:
    assert is_valid_sandbox_id(value) is valid


@pytest.mark.parametrize("value", [None, 42, b"org-abc"], ids=["None", "int", "bytes"])
def test_is_valid_sandbox_id_rejects_non_strings(value: object) -> None:
    assert is_valid_sandbox_id(value) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "prefix"),
    [
        pytest.param("ses-abc", "ses", id="ses"),
        pytest.param("ubt-abc", "ubt", id="ubt"),
        pytest.param("org-id__user-id", "", id="legacy"),
        pytest.param("org-XYZ", "", id="invalid"),
    ],
)
def test_sandbox_id_prefix(value: str, prefix: str) -> None:
    assert sandbox_id_prefix(value) == prefix


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------

texts = st.text(max_size=40)
optional_texts = st.none() | texts


@PROPERTY_SETTINGS
@given(org_id=optional_texts, user_id=texts, bot_id=optional_texts)
def test_shared_id_matches_reference_and_is_a_label(org_id: str | None, user_id: str, bot_id: str | None) -> None:
    sandbox_id = shared_sandbox_id(org_id, user_id, bot_id)
    assert sandbox_id == reference_shared_id(org_id, user_id, bot_id)
    assert_well_formed(sandbox_id)
    assert is_valid_sandbox_id(sandbox_id)


@PROPERTY_SETTINGS
@given(org_id=optional_texts, user_id=texts, bot_id=optional_texts)
def test_prefix_is_determined_by_truthiness(org_id: str | None, user_id: str, bot_id: str | None) -> None:
    expected = ("bot" if org_id else "ubt") if bot_id else ("org" if org_id else "usr")
    assert sandbox_id_prefix(shared_sandbox_id(org_id, user_id, bot_id)) == expected


@PROPERTY_SETTINGS
@given(session_id=texts)
def test_per_session_id_matches_reference_and_is_a_label(session_id: str) -> None:
    sandbox_id = per_session_sandbox_id(session_id)
    assert sandbox_id == reference_session_id(session_id)
    assert_well_formed(sandbox_id)
    assert sandbox_id_prefix(sandbox_id) == "ses"


@PROPERTY_SETTINGS
@given(
    session_id=st.text(min_size=1, max_size=40),
    owners=st.lists(st.tuples(optional_texts, st.text(min_size=1, max_size=40), optional_texts), min_size=2, max_size=5),
)
def test_per_session_ids_depend_on_the_session_only(
    session_id: str, owners: list[tuple[str | None, str, str | None]]
) -> None:
    policy = default_policy(["*"])
    ids = {place(Identity(org_id=o, user_id=u, session_id=session_id, bot_id=b), policy).sandbox_id for o, u, b in owners}
    assert ids == {per_session_sandbox_id(session_id)}


@PROPERTY_SETTINGS
@given(
    org_id=optional_texts,
    user_id=st.text(min_size=1, max_size=40),
    bot_id=st.none() | st.text(min_size=1, max_size=40),
    sessions=st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=5),
)
def test_shared_ids_never_depend_on_the_session(
    org_id: str | None, user_id: str, bot_id: str | None, sessions: list[str]
) -> None:
    policy = default_policy()
    ids = {place(Identity(org_id=org_id, user_id=user_id, session_id=s, bot_id=bot_id), policy).sandbox_id for s in sessions}
    assert ids == {shared_sandbox_id(org_id, user_id, bot_id)}


# --------------------------------------------------------------------------------------
# Identity.parse
# --------------------------------------------------------------------------------------

VALID = {"user_id": "u", "session_id": "s", "org_id": "o", "bot_id": "b"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        pytest.param({"user_id": None}, "user_id", id="missing user"),
        pytest.param({"session_id": None}, "session_id", id="missing session"),
        pytest.param({"user_id": ""}, "user_id", id="empty user"),
        pytest.param({"session_id": ""}, "session_id", id="empty session"),
        pytest.param({"user_id": "a\x00b"}, "user_id", id="NUL in user"),
        pytest.param({"session_id": "a\nb"}, "session_id", id="newline in session"),
        pytest.param({"org_id": "a\x7fb"}, "org_id", id="DEL in org"),
        pytest.param({"bot_id": "a\u2028b"}, "bot_id", id="line separator in bot"),
        pytest.param({"org_id": "a\x85b"}, "org_id", id="C1 NEL in org"),
        pytest.param({"user_id": "a\tb"}, "user_id", id="tab in user"),
        pytest.param({"user_id": "x" * 257}, "user_id", id="257-char user"),
        pytest.param({"session_id": "x" * 257}, "session_id", id="257-char session"),
        pytest.param({"org_id": "x" * 257}, "org_id", id="257-char org"),
        pytest.param({"bot_id": "x" * 257}, "bot_id", id="257-char bot"),
        pytest.param({"user_id": 42}, "user_id", id="int user"),
        pytest.param({"session_id": ["s"]}, "session_id", id="list session"),
        pytest.param({"org_id": 1.5}, "org_id", id="float org"),
        pytest.param({"bot_id": b"b"}, "bot_id", id="bytes bot"),
        pytest.param({"org_id": False}, "org_id", id="bool org"),
        # A lone surrogate arrives from JSON ("\ud800") or from a header decoded with
        # surrogateescape (an invalid UTF-8 byte). It cannot be UTF-8 encoded, so
        # hashing it raises UnicodeEncodeError: it must be rejected here, at the boundary.
        pytest.param({"user_id": "u\udcff"}, "user_id", id="lone surrogate in user"),
        pytest.param({"session_id": "\ud800"}, "session_id", id="lone surrogate in session"),
        pytest.param({"org_id": "o\udfff"}, "org_id", id="lone surrogate in org"),
        # Bidirectional overrides make "\u202eemca" display as "acme" (Trojan Source).
        pytest.param({"org_id": "\u202eemca"}, "org_id", id="right-to-left override in org"),
        pytest.param({"user_id": "a\u2066b"}, "user_id", id="left-to-right isolate in user"),
        pytest.param({"bot_id": "\u200fbot"}, "bot_id", id="right-to-left mark in bot"),
    ],
)
def test_identity_parse_rejects(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        Identity.parse(**{**VALID, **overrides})
    assert excinfo.value.field == field
    assert str(excinfo.value).startswith(field + ": ")
    assert isinstance(excinfo.value, ValueError)


def test_identity_parse_reports_user_before_session() -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        Identity.parse(user_id=None, session_id=None)
    assert excinfo.value.field == "user_id"


@pytest.mark.parametrize("field", ["user_id", "session_id", "org_id", "bot_id"])
def test_identity_parse_accepts_256_chars(field: str) -> None:
    identity = Identity.parse(**{**VALID, field: "x" * 256})
    assert getattr(identity, field) == "x" * 256


def test_identity_parse_empty_bot_is_none() -> None:
    assert Identity.parse(user_id="u", session_id="s", bot_id="").bot_id is None


def test_identity_parse_empty_org_stays_empty() -> None:
    identity = Identity.parse(user_id="u", session_id="s", org_id="")
    assert identity.org_id == ""
    # ... and so hashes with an empty org segment and the usr prefix (Kilo-compatible).
    assert place(identity, default_policy()).sandbox_id == reference_shared_id("", "u", None)


def test_identity_parse_defaults_and_unicode() -> None:
    identity = Identity.parse(user_id="user-한국", session_id="s")
    assert identity == Identity(user_id="user-한국", session_id="s", org_id=None, bot_id=None)
    assert identity.owner_key() == (None, "user-한국", None)


# Raw boundary input: any code point, lone surrogates and control characters included
# (hypothesis' default text strategy never produces surrogates). Mostly printable, so
# that plenty of identities are accepted; one character in five is hostile.
_printable = st.characters(categories=["L", "M", "N", "P", "S", "Zs"])
_hostile = st.characters(categories=["Cs"]) | st.characters(categories=["Cc", "Cf", "Zl", "Zp"])
raw_chars = st.one_of(_printable, _printable, _printable, _hostile)
raw_texts = st.text(alphabet=raw_chars, max_size=20)


@PROPERTY_SETTINGS
@given(user_id=raw_texts, session_id=raw_texts, org_id=st.none() | raw_texts, bot_id=st.none() | raw_texts)
def test_every_parsed_identity_can_be_placed(user_id: str, session_id: str, org_id: str | None, bot_id: str | None) -> None:
    """Whatever Identity.parse accepts, place() handles (no 500 for bad input)."""
    try:
        identity = Identity.parse(user_id=user_id, session_id=session_id, org_id=org_id, bot_id=bot_id)
    except InvalidIdentity:
        return
    for policy in (default_policy(), default_policy(["*"])):
        assert_well_formed(place(identity, policy).sandbox_id)


def test_format_characters_other_than_bidi_controls_stay_valid() -> None:
    """Zero-width joiners hold emoji sequences together: only the bidirectional controls are refused."""
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467"
    assert Identity.parse(org_id=family, user_id="a\u200bb", session_id="s").org_id == family
