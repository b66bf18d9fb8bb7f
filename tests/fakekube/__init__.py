"""A faithful fake kube-apiserver for the agent-sandbox CRDs, driven through the real
kubernetes_asyncio client over HTTP. See server.py (HTTP surface), api.py (request pipeline),
controller.py (simulated controller) and fixtures.py (pytest fixtures)."""

from .api import Api, CreateRecord
from .controller import FakeController
from .errors import ApiError
from .fixtures import FakeKube, start_fake_kube, write_kubeconfig
from .server import FakeKubeServer

__all__ = ["Api", "ApiError", "CreateRecord", "FakeController", "FakeKube", "FakeKubeServer", "start_fake_kube",
           "write_kubeconfig"]
