"""Every GatewayError has a gRPC status of its own choosing, never UNKNOWN or OK (errors.py's one table)."""

from __future__ import annotations

import pytest
from grpclib.const import Status

from gateway import errors
from gateway.grpcfront.metrics import status_name
from tests.test_errors import all_subclasses


@pytest.mark.parametrize("cls", [errors.GatewayError, *all_subclasses(errors.GatewayError)], ids=lambda c: c.__name__)
def test_every_error_sets_its_grpc_status(cls):
    assert "grpc_status" in cls.__dict__, f"{cls.__name__} inherits its gRPC status; set it in gateway/errors.py"
    assert cls.grpc_status not in (Status.OK, Status.UNKNOWN)
    assert cls.grpc_status.name in errors.__doc__.split(cls.__name__, 1)[1].splitlines()[0]  # the table says so


@pytest.mark.parametrize(("cls", "status"), [
    pytest.param(errors.Unauthorized, Status.UNAUTHENTICATED, id="no or bad identity"),
    pytest.param(errors.Forbidden, Status.PERMISSION_DENIED, id="forbidden"),
    pytest.param(errors.NotFound, Status.NOT_FOUND, id="another owner's session"),
    pytest.param(errors.BadRequest, Status.INVALID_ARGUMENT, id="bad metadata"),
    pytest.param(errors.CapacityExceeded, Status.RESOURCE_EXHAUSTED, id="over a cap"),
    pytest.param(errors.UpstreamConnectError, Status.UNAVAILABLE, id="sandbox down"),
    pytest.param(errors.UpstreamTimeout, Status.DEADLINE_EXCEEDED, id="sandbox too slow"),
])
def test_the_contract_statuses(cls, status):
    assert cls.grpc_status is status


def test_status_names_match_grpclib():
    assert all(status_name(s.value) == s.name for s in Status)


def test_a_tls_certificate_needs_its_key(tmp_path):
    from pydantic import ValidationError

    from gateway.settings import Settings

    with pytest.raises(ValidationError, match="_CERT_FILE and SANDBOX_GATEWAY_GRPC_TLS_KEY_FILE go together"):
        Settings(grpc_tls_cert_file=tmp_path / "grpc.crt")
