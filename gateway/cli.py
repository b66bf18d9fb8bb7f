"""The ``sandbox-gateway`` command.

``serve`` runs the gateway; ``route`` and ``check-policy`` are the pure routing
core on the command line; ``runtime`` is the reference sandbox runtime the
local provider starts. Bad input is one line on stderr and exit code 2
(``check-policy`` exits 1 when the file has errors, listing all of them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from gateway.policy import parse_policy
from gateway.settings import SERVE_FLAGS, SESSION_TTL_SETTING, PolicySettings, refusal
from routing import Identity, InvalidIdentity, PolicyError, default_policy, parse_org_list, place


def _fail(message: str) -> NoReturn:
    print(f"sandbox-gateway: error: {message}", file=sys.stderr)
    raise SystemExit(2)


_CHECK_POLICY_FLAGS = {"session_ttl": "--session-ttl"}


def _policy_settings(flags: dict[str, str]) -> PolicySettings:
    """What ``route`` and ``check-policy`` read from the environment; a bad value is one line naming it."""
    try:
        return PolicySettings()
    except ValidationError as exc:
        _fail(refusal(exc, flags))


def _env_per_session_orgs(flags: dict[str, str]) -> list[str]:
    """``PER_SESSION_SANDBOX_ORG_IDS`` (or ``SANDBOX_GATEWAY_PER_SESSION_ORG_IDS``), as ``serve`` reads it."""
    return parse_org_list(_policy_settings(flags).per_session_org_ids)


def _cmd_route(args: argparse.Namespace) -> int:
    extra = _env_per_session_orgs({})
    try:
        if args.policy is not None:
            policy = parse_policy(Path(args.policy).read_text(encoding="utf-8"), args.policy, extra)
        else:
            policy = default_policy(extra)
        identity = Identity.parse(org_id=args.org, user_id=args.user, session_id=args.session, bot_id=args.bot)
    except OSError as exc:
        _fail(f"cannot read policy file {args.policy}: {exc.strerror}")
    except PolicyError as exc:
        _fail(str(exc).replace("\n", "; "))
    except InvalidIdentity as exc:
        flag = {"org_id": "--org", "user_id": "--user", "session_id": "--session", "bot_id": "--bot"}[exc.field]
        _fail(f"{flag}: {exc.reason}")
    print(json.dumps(place(identity, policy).as_dict()))
    return 0


def _seconds(text: str) -> float:
    from routing.policy import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_check_policy(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"{args.file}: cannot read: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        settings = _policy_settings(_CHECK_POLICY_FLAGS)
        policy = parse_policy(text, args.file, parse_org_list(settings.per_session_org_ids))
        policy.check_session_ttl(args.session_ttl or settings.session_ttl,
                                 "--session-ttl" if args.session_ttl else SESSION_TTL_SETTING)
    except PolicyError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"{len(exc.errors)} error(s)", file=sys.stderr)
        return 1
    print(policy.summary())
    print("ok")
    return 0


# argparse destination -> setting, from the one map of settings to flags
_SERVE_FLAGS: dict[str, str] = {flag[2:].replace("-", "_"): field for field, flag in SERVE_FLAGS.items()}


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.server import serve
    from gateway.settings import Settings

    overrides: dict[str, Any] = {
        field: getattr(args, flag) for flag, field in _SERVE_FLAGS.items() if getattr(args, flag) is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        _fail(refusal(exc))
    try:
        return serve(settings)
    except PolicyError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 2
    except OSError as exc:
        _fail(f"cannot listen: {exc.strerror or exc}")


def _cmd_token_issue(args: argparse.Namespace) -> int:
    from gateway.auth import ADMIN_AUDIENCE, DATA_AUDIENCE, KeySet, issue_token
    from routing.policy import parse_duration

    try:
        ttl = parse_duration(args.ttl)
    except ValueError as exc:
        _fail(f"--ttl: {exc} (got {args.ttl!r})")
    try:
        keys = KeySet.load(Path(args.keys))
    except OSError as exc:
        _fail(f"--keys: cannot read {args.keys}: {exc.strerror or exc}")
    except ValueError as exc:
        _fail(f"--keys: {exc}")
    key = keys.get(args.kid) if args.kid else keys.first()
    if key is None:
        _fail(f"--kid: no key {args.kid!r} in {args.keys}")
    if not args.admin:
        try:
            Identity.parse(org_id=args.org, user_id=args.user, session_id="-", bot_id=args.bot)
        except InvalidIdentity as exc:
            _fail(f"--{exc.field.removesuffix('_id')}: {exc.reason}")
    try:
        token = issue_token(key, user=args.user, org=args.org, bot=args.bot, ttl=ttl,
                            audience=ADMIN_AUDIENCE if args.admin else DATA_AUDIENCE)
    except ValueError as exc:
        _fail(f"--kid: {exc}")
    print(token)
    return 0


def _cmd_runtime(args: argparse.Namespace) -> int:
    from gateway.runtime.__main__ import main as runtime_main

    forwarded = ["--host", args.host, "--port", str(args.port), "--root", str(args.root), "--sandbox-id",
                 args.sandbox_id]
    for flag, value in (("--listen-fd", args.listen_fd), ("--grpc-port", args.grpc_port),
                        ("--grpc-fd", args.grpc_fd)):
        if value is not None:
            forwarded += [flag, str(value)]
    return runtime_main(forwarded)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-gateway",
                                     description="A routing gateway in front of code-execution sandboxes.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the gateway (data plane and control API)",
                           description="Run the gateway. Flags override SANDBOX_GATEWAY_* environment variables.")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--data-port", type=int, help="data-plane port (default 8080; 0 = any free port)")
    serve.add_argument("--control-port", type=int, help="control API port (default 8081; 0 = any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC front port, h2c (default 50051; 0 = any free port)")
    serve.add_argument("--workers", metavar="N|auto",
                       help="worker processes sharing the ports (default 1; >1 needs REDIS_URL; auto: one per core "
                            "with REDIS_URL, else 1)")
    serve.add_argument("--policy", help="policy YAML file (default: built-in two local pools)")
    serve.add_argument("--data-dir", help="where local sandboxes keep their files (default .sandbox-gateway)")
    serve.add_argument("--redis-url", help="shared session store (default: in memory, one process)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["auto", "json", "text"])
    serve.add_argument("--auth-mode", choices=["trusted-headers", "token"],
                       help="identity from trusted X-* headers (private networks only) or signed bearer tokens; "
                            "required unless listening on loopback")
    serve.add_argument("--auth-keys", help="token key file (needed for --auth-mode token; also guards the control API)")
    serve.add_argument("--allowed-hosts", metavar="NAMES",
                       help="host names clients reach the gateway by, comma-separated ('.example.com' for every name "
                            "under it, '*' for any); other Hosts get 421 (DNS rebinding). Default on loopback: "
                            "localhost and *.localhost; required on any other address")
    serve.add_argument("--allow-example-keys", action="store_true", default=None,
                       help="accept the published example key secret (examples/auth/keys.yaml) off loopback: "
                            "a demo only, since anyone can sign tokens with it")
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                       help="one log line per data-plane request (default on)")
    serve.set_defaults(func=_cmd_serve)

    route = sub.add_parser("route", help="print the sandbox decision for an identity (creates nothing)",
                           description="Dry-run placement: prints {sandbox_id, pool, isolation} as JSON.")
    route.add_argument("--org", help="org ID (omit for a personal account)")
    route.add_argument("--user", required=True, help="user ID")
    route.add_argument("--session", required=True, help="session ID")
    route.add_argument("--bot", help="bot ID (optional)")
    route.add_argument("--policy", help="policy YAML file (default: built-in)")
    route.set_defaults(func=_cmd_route)

    check = sub.add_parser("check-policy", help="validate a policy file",
                           description="Validate a policy file: a summary and exit 0, or every error and exit 1.")
    check.add_argument("file", help="policy YAML file")
    check.add_argument("--session-ttl", type=_seconds, metavar="DURATION",
                       help="the session_ttl the gateway runs with (default: $SANDBOX_GATEWAY_SESSION_TTL, else 1d); "
                            "a pool whose idle sandboxes outlive it is an error")
    check.set_defaults(func=_cmd_check_policy)

    token = sub.add_parser("token", help="issue signed bearer tokens (auth mode 'token')",
                           description="Operator tools for signed bearer tokens.")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    issue = token_sub.add_parser("issue", help="print a signed token for an identity",
                                 description="Print a signed JWT for an org/user/bot (or an admin token).")
    issue.add_argument("--keys", required=True, help="key file (see examples/auth/keys.yaml)")
    issue.add_argument("--kid", help="key to sign with (default: the first key)")
    issue.add_argument("--org", help="org ID (omit for a personal account)")
    issue.add_argument("--user", required=True, help="user ID (the token's sub)")
    issue.add_argument("--bot", help="bot ID (optional)")
    issue.add_argument("--ttl", default="1h", help="lifetime, e.g. 15m, 1h (default 1h)")
    issue.add_argument("--admin", action="store_true", help="an admin token for the control API")
    issue.set_defaults(func=_cmd_token_issue)

    runtime = sub.add_parser("runtime", help="run the reference sandbox runtime (one sandbox)",
                             description="The reference sandbox runtime the local provider starts.")
    from gateway.runtime.__main__ import add_arguments as runtime_arguments

    runtime_arguments(runtime)  # one set of flags with `python -m gateway.runtime` (--grpc-port among them)
    runtime.set_defaults(func=_cmd_runtime)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
