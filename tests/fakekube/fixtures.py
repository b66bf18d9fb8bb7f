"""pytest fixtures for the fake kube-apiserver. Wire into tests/conftest.py with:

    from tests.fakekube.fixtures import fake_kube, make_fake_kube  # noqa: F401

`make_fake_kube(crd_set="v1.0", **options)` is a factory fixture (several servers per test are
fine); `fake_kube` is one started server with its controller, for `crd_set="v1.0"` (agent-sandbox
v1.0: v1beta1 only) unless the test parametrizes it indirectly:
`@pytest.mark.parametrize("fake_kube", ["v1.0", "v0.4.6"], indirect=True)`.
Everything is stopped at teardown, and a failure inside the simulated controller fails the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client, config

from .controller import FakeController
from .crds import DEFAULT_CRD_SET
from .server import FakeKubeServer

TOKEN = "fakekube-token"


@dataclass
class FakeKube:
    """A running fake apiserver: `url`, `server` (store, hooks), `controller`, `kubeconfig_path`."""

    url: str
    server: FakeKubeServer
    controller: FakeController
    kubeconfig_path: Path
    namespace: str = "default"
    _clients: list[client.ApiClient] = field(default_factory=list, repr=False)

    @property
    def crd_set(self) -> str:
        return self.server.crd_set

    async def api_client(self) -> client.ApiClient:
        """A kubernetes_asyncio ApiClient configured from `kubeconfig_path` (the caller closes it;
        teardown closes any left open)."""
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(self.kubeconfig_path), client_configuration=cfg)
        api = client.ApiClient(configuration=cfg)
        self._clients.append(api)
        return api

    async def close(self) -> None:
        for api in self._clients:
            await api.close()
        await self.controller.stop()
        await self.server.stop()


def write_kubeconfig(path: Path, url: str, token: str, namespace: str = "default") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fakekube", "cluster": {"server": url}}],
        "users": [{"name": "fakekube", "user": {"token": token}}],
        "contexts": [{"name": "fakekube", "context": {"cluster": "fakekube", "user": "fakekube",
                                                       "namespace": namespace}}],
        "current-context": "fakekube",
    }))
    return path


async def start_fake_kube(tmp_path: Path, crd_set: str = DEFAULT_CRD_SET, *, namespaces: tuple[str, ...] = ("default",),
                          history_size: int = 1000, ready_delay: float = 0.05,
                          pod_ip_for: Callable[[str, str], str] | None = None,
                          ready_when_suspended: bool | None = None, token: str = TOKEN,
                          **server_options: Any) -> FakeKube:
    server = FakeKubeServer(crd_set, history_size=history_size, namespaces=namespaces, token=token, **server_options)
    url = await server.start()
    controller = FakeController(server, ready_delay=ready_delay, pod_ip_for=pod_ip_for,
                                ready_when_suspended=ready_when_suspended)
    await controller.start()
    kubeconfig = write_kubeconfig(tmp_path / f"kubeconfig-{crd_set}-{url.rsplit(':', 1)[1]}", url, token,
                                  namespaces[0])
    return FakeKube(url, server, controller, kubeconfig, namespaces[0])


MakeFakeKube = Callable[..., Awaitable[FakeKube]]


@pytest_asyncio.fixture
async def make_fake_kube(tmp_path: Path) -> AsyncIterator[MakeFakeKube]:
    """Factory: `kube = await make_fake_kube(crd_set="v0.4.6", ready_delay=0, namespaces=("a", "b"))`."""
    started: list[FakeKube] = []

    async def make(crd_set: str = DEFAULT_CRD_SET, **options: Any) -> FakeKube:
        kube = await start_fake_kube(tmp_path, crd_set, **options)
        started.append(kube)
        return kube

    yield make
    errors = [e for kube in started for e in kube.controller.errors]
    for kube in reversed(started):
        await kube.close()
    assert not errors, f"the fakekube controller failed: {errors!r}"


@pytest_asyncio.fixture
async def fake_kube(request: pytest.FixtureRequest, make_fake_kube: MakeFakeKube) -> FakeKube:
    """One started fake apiserver + controller; crd_set "v1.0" unless parametrized indirectly."""
    return await make_fake_kube(getattr(request, "param", DEFAULT_CRD_SET))
