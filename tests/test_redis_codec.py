"""The Redis store's compact encodings: every binding round-trips, the text form is the small one,
and what earlier versions wrote (JSON bindings, plain owner IDs, float times) still reads."""

from __future__ import annotations

import pytest

from gateway.model import Binding, Owner, SandboxRecord, SandboxState
from gateway.store import redis_codec as codec
from routing import Isolation, per_session_sandbox_id, shared_sandbox_id

ORG = "9d278969-5453-4ae3-a51f-a8d2274a7b56"
USER = "fd93a81c-63c2-4d14-84b3-60d6ac3b592f"


def per_session(owner: Owner, session: str = "agent_session-1", pool: str = "small") -> Binding:
    return Binding(session, per_session_sandbox_id(session), pool, Isolation.PER_SESSION, owner, 1_700_000_000.125)


def shared(owner: Owner, sandbox_id: str | None = None) -> Binding:
    sandbox = sandbox_id or shared_sandbox_id(owner.org_id, owner.user_id, owner.bot_id)
    return Binding("s1", sandbox, "shared", Isolation.SHARED, owner, 1_700_000_000.0)


BINDINGS = [
    pytest.param(per_session(Owner(ORG, USER, None)), id="per-session, UUID org and user"),
    pytest.param(per_session(Owner(None, "alice", None)), id="personal account: org None"),
    pytest.param(per_session(Owner("", "alice", "bot-1")), id="empty org is not None, with a bot"),
    pytest.param(shared(Owner(ORG.upper(), USER, USER)), id="upper-case UUID stays as written"),
    pytest.param(shared(Owner("acme", "bob", None), "org-legacy__id"), id="sandbox ID not derived, no bot"),
    pytest.param(shared(Owner("acme", "bob", "b"), "org-legacy__id"), id="sandbox ID not derived, with a bot"),
    pytest.param(per_session(Owner("acme", "bob", None), pool="[odd]"), id="pool starting with a bracket: JSON"),
    pytest.param(per_session(Owner("acme", "bob", None), pool="p\x1fq"), id="control character in a pool name: JSON"),
]


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_binding_round_trips(binding: Binding) -> None:
    assert codec.binding_of(binding.session_id, codec.binding_value(binding)) == binding


def test_the_text_form_of_two_uuids_is_a_small_allocation() -> None:
    value = codec.binding_value(per_session(Owner(ORG, USER, None)))
    assert not value.startswith("[") and len(value.encode()) <= 76  # an 80-byte sds, where JSON needs 128


def test_a_binding_written_as_json_by_an_earlier_version_still_reads() -> None:
    session = "agent_session-1"
    raw = f'["small","per_session",1700000000.5,"{ORG}","{USER}",null]'
    assert codec.binding_of(session, raw) == Binding(session, per_session_sandbox_id(session), "small",
                                                     Isolation.PER_SESSION, Owner(ORG, USER, None), 1_700_000_000.5)


@pytest.mark.parametrize(("value", "stored"), [(1_700_000_000.0, "1700000000"), (1_700_000_000.25, "1700000000.25"),
                                               (1_700_000_000.1234567, "1700000000.123")])
def test_times_are_whole_seconds_where_they_are_one(value: float, stored: str) -> None:
    assert codec.seconds(value) == stored


def test_a_record_reads_packed_and_plain_owner_ids() -> None:
    owner = Owner(ORG, USER, USER)
    record = SandboxRecord("ses-x", "small", ORG, SandboxState.READY, created_at=1_700_000_000.0, owner=owner)
    fields = dict(zip(*[iter(codec.static_fields(record))] * 2, strict=True))
    assert len(fields["u"]) == 23 and fields["c"] == "1700000000"
    for user, bot in ((fields["u"], fields["b"]), (USER, USER)):  # this version's, an earlier version's
        view = ["ready", "small", ORG, fields["c"], "http 10.0.0.1 8888", "0", "g1", user, bot, None, None, "1", "5.0"]
        read, gen = codec.record_of("ses-x", view)
        assert read.owner == owner and read.created_at == 1_700_000_000.0 and gen == "g1"


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_folded_binding_is_the_text_form_split_in_two_short_values(binding: Binding) -> None:
    value = codec.binding_value(binding)
    parts = codec.folded(binding, value)
    per_session_text = binding.isolation is Isolation.PER_SESSION and not value.startswith("[")
    assert (parts is not None) == per_session_text  # shared, or JSON: kept under a key of its own
    if parts is not None:
        head, tail = parts
        assert head + "\x1f" + tail == value
        if binding.owner.bot_id is None:
            assert len(head.encode()) <= 64 and len(tail.encode()) <= 64  # each within a listpack value


def test_a_per_session_binding_to_another_sessions_sandbox_does_not_fold() -> None:
    binding = Binding("s1", per_session_sandbox_id("other"), "small", Isolation.PER_SESSION, Owner(ORG, USER, None), 1.0)
    assert codec.folded(binding, codec.binding_value(binding)) is None
