"""``python -m gateway.runtime (--host H --port P | --listen-fd N) --root DIR --sandbox-id ID``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .server import run


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The runtime's flags, shared with ``sandbox-gateway runtime``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument(
        "--port", type=_port, default=8888, help="port to bind; 0 picks a free one (default: %(default)s)"
    )
    parser.add_argument(
        "--listen-fd", type=int, default=None, metavar="N",
        help="serve on this inherited listening socket instead of binding --host/--port (the local provider "
             "passes a Unix socket only the gateway can reach)")
    parser.add_argument("--root", type=Path, required=True, help="the sandbox's working directory (created if missing)")
    parser.add_argument("--sandbox-id", default="", help="reported by / and in X-Runtime-Sandbox-Id")
    parser.add_argument("--grpc-port", type=_port, default=None,
                        help="also serve the gRPC service (runtime.proto) on this port; 0 picks a free one")
    parser.add_argument(
        "--grpc-fd", type=int, default=None, metavar="N",
        help="also serve the gRPC service on this inherited listening socket (the local provider passes a "
             "second Unix socket beside the HTTP one)")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags and serve until SIGTERM; prints ``LISTENING <host> <port>`` once bound."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.runtime",
        description="Reference sandbox runtime: one process per sandbox, agent-sandbox runtime API.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args.host, args.port, args.root, args.sandbox_id, listen_fd=args.listen_fd, grpc_port=args.grpc_port,
            grpc_fd=args.grpc_fd)
    except OSError as exc:  # cannot bind, cannot create root: one line, not a traceback
        print(f"sandbox runtime: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
