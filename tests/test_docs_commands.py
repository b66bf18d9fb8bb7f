"""Documented ``serve`` command lines start as written: the README's token walkthrough and
docs/deployment.md's by-hand container run (its ``serve`` arguments and ``-e`` variables, on this
host instead of in the image). Ports come from the kernel: only the ports differ from the docs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import aiohttp

from tests.gateway_process import GatewayProcess

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_KEYS = REPO / "examples" / "auth" / "keys.yaml"


def _shell_lines(markdown: Path, starts: str) -> list[str]:
    """The command in ``markdown`` that starts with ``starts``, continuation lines joined, as words."""
    text = markdown.read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.strip().startswith(starts))
    return shlex.split(line.strip())


async def _starts(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    process = GatewayProcess(tmp_path / "gw", *args, env=env)
    await process.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{process.control_url}/healthz") as response:
            assert response.status == 200
    finally:
        assert await process.stop() == 0


async def test_the_readme_token_walkthrough_starts_as_written(tmp_path: Path) -> None:
    words = _shell_lines(REPO / "README.md", "sandbox-gateway serve --host 0.0.0.0")
    env = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=.*", word))
    args = words[words.index("serve") + 1:]
    args[args.index("examples/auth/keys.yaml")] = str(EXAMPLE_KEYS)
    assert "--allow-example-keys" in args  # a demo, said so: off loopback the example key is refused
    await _starts(tmp_path, args, env)


async def test_the_by_hand_container_run_starts_as_written(tmp_path: Path) -> None:
    words = _shell_lines(REPO / "docs" / "deployment.md", "podman --runtime runc run")
    assert {"--ulimit", "--runtime"} <= set(words)  # explicit rlimits and runc: see the paragraph after it
    env = dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "-e")
    image = next(i for i, word in enumerate(words) if word.startswith("sandbox-gateway:"))
    args = [str(EXAMPLE_KEYS) if word == "/etc/sandbox-gateway/keys.yaml" else word for word in words[image + 2:]]
    assert words[image + 1] == "serve"
    await _starts(tmp_path, args, env)


def test_the_mcp_recipe_installs_what_its_server_and_client_import() -> None:
    """docs/clients.md recipe 6 adds only ``mcp`` to the serve venv: it must bring the server's uvicorn
    and the client's httpx2 (tests/mcp_sandbox.py and the recipe's client import them)."""
    from importlib.metadata import requires

    recipe = (REPO / "docs" / "clients.md").read_text(encoding="utf-8").split("## 6. MCP client", 1)[1]
    assert "pip install 'mcp>=2.3'" in recipe.split("## 7.", 1)[0]
    needed = {re.split(r"[ ;<>=!\[]", line, maxsplit=1)[0].lower() for line in requires("mcp") or []
              if "extra ==" not in line}
    assert {"uvicorn", "httpx2"} <= needed
    assert "import uvicorn" in (REPO / "tests" / "mcp_sandbox.py").read_text(encoding="utf-8")
