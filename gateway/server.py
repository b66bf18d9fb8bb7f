"""``serve``: bind the listeners, run one or N gateway processes, drain on SIGTERM.

With ``--workers N`` every worker binds the same ports with ``SO_REUSEPORT``
and the kernel spreads connections across them. The supervisor first binds
(without listening) to reserve the ports, so ``--data-port 0`` still gives all
workers one port; a bound socket that never listens receives no connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import socket
import tempfile

from gateway.app import Gateway, confinement_problem, example_keys_problem
from gateway.collector import PacedCollections, tune_gc
from gateway.gate import connection_bounds, raise_descriptor_limit
from gateway.logs import AccessLog, configure_logging
from gateway.settings import Settings

log = logging.getLogger("gateway")


def bind(host: str, port: int, *, listen: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
        sock.setblocking(False)
    return sock


def _in_use(host: str, port: int) -> bool:
    """True when something listens on the port already. Our own sockets set SO_REUSEPORT, so a
    second gateway would bind next to the first and the kernel would split connections between
    two processes that share no state; a plain bind (no SO_REUSEPORT) is refused instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _use_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve_one(settings: Settings, data_port: int, control_port: int, worker: int, grpc_port: int,
                     access: AccessLog | None) -> None:
    gateway = Gateway.create(settings, access)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    data_sock = bind(settings.host, data_port, listen=True)
    control_sock = bind(settings.host, control_port, listen=True)
    grpc_sock = bind(settings.host, grpc_port, listen=True)
    await gateway.start(data_sock, control_sock, grpc_sock)
    # What start-up allocated (modules, settings, clients: a large heap that lives as long as the
    # process) leaves the cyclic collector's view: its full collections then walk only what serving
    # allocates, instead of every object of the process each time (tens of ms, in the middle of
    # requests). Requests' own cycles are still collected.
    gc.collect()
    gc.freeze()
    tune_gc()  # and young collections paced by the clock, not only by allocations (gateway/collector.py)
    collections = PacedCollections(loop)
    collections.start()
    if worker == 0:
        for line in gateway.describe():
            log.info(line)
    dh, dp = gateway.data_address or ("?", 0)
    ch, cp = gateway.control_address or ("?", 0)
    gh, gp = gateway.grpc_address or ("?", 0)
    scheme = "https" if settings.grpc_tls_cert_file and settings.grpc_tls_key_file else "h2c"  # as GrpcFront._tls
    log.info("gRPC front (worker %d): %s://%s:%d", worker, scheme, gh, gp)  # before "serving", which tests wait for
    log.info("serving (worker %d, pid %d): data plane http://%s:%d, control API http://%s:%d",
             worker, os.getpid(), dh, dp, ch, cp)
    await stop.wait()
    fate = ("sandboxes stay up for the other replicas" if settings.redis_url
            else "local sandboxes stop with this memory-store gateway")
    log.info("draining (worker %d): up to %gs for in-flight requests; %s", worker, settings.drain_timeout, fate)
    collections.stop()
    await gateway.stop()
    log.info("stopped (worker %d)", worker)


def _keep_fds_from_children() -> None:
    """Make every descriptor above stderr close on exec (whatever started us may have passed some).

    A worker inherits descriptors from multiprocessing (its resource tracker's pipe among them),
    and the local provider's sandboxes, which outlive the worker, would inherit them in turn: the
    tracker then never sees the pipe close and lives on, holding the supervisor's stderr open with
    it (whoever reads that stderr never gets EOF). The worker itself keeps using them.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _worker_main(settings: Settings, data_port: int, control_port: int, worker: int, grpc_port: int) -> None:
    _keep_fds_from_children()
    access = configure_logging(settings.log_level, settings.log_format, keep_query=settings.access_log_query)
    _use_uvloop()
    asyncio.run(_serve_one(settings, data_port, control_port, worker, grpc_port, access))


def serve(settings: Settings) -> int:
    _keep_fds_from_children()
    access = configure_logging(settings.log_level, settings.log_format, keep_query=settings.access_log_query)
    workers = settings.worker_count
    if workers > 1 and not settings.redis_url:
        log.error("--workers %d needs REDIS_URL: with the memory store every worker would keep "
                  "its own session map and sandboxes could be created twice", workers)
        return 2
    if settings.workers == "auto":
        log.info("workers: auto -> %d%s", workers, "" if settings.redis_url else
                 " (the memory store is one process's; with REDIS_URL, one per core)")
    # The key file, the policy and what it needs of this host are checked before any port: a broken
    # policy is reported as such even while another gateway holds the ports.
    problem = example_keys_problem(settings) or confinement_problem(settings)
    if problem is not None:
        log.error("%s", problem)
        return 2
    busy = [port for port in (settings.data_port, settings.control_port, settings.grpc_port)
            if port and _in_use(settings.host, port)]
    if busy:
        log.error("port %d on %s is already in use (another sandbox-gateway?); SO_REUSEPORT would otherwise "
                  "share it silently with a gateway that has its own sessions", busy[0], settings.host)
        return 2
    _raise_descriptor_limit(settings)
    # Reserve the ports (and resolve port 0) before any worker starts.
    data_reserve = bind(settings.host, settings.data_port, listen=False)
    control_reserve = bind(settings.host, settings.control_port, listen=False)
    grpc_reserve = bind(settings.host, settings.grpc_port, listen=False)
    data_port, control_port = data_reserve.getsockname()[1], control_reserve.getsockname()[1]
    grpc_port = grpc_reserve.getsockname()[1]
    try:
        if workers == 1:
            _use_uvloop()
            asyncio.run(_serve_one(settings, data_port, control_port, 0, grpc_port, access))
            return 0
        return _supervise(settings, data_port, control_port, grpc_port)
    finally:
        data_reserve.close()
        control_reserve.close()
        grpc_reserve.close()


def _raise_descriptor_limit(settings: Settings) -> None:
    """Every connection is a descriptor: take all the kernel allows (workers inherit it), and say what each
    listener may hold of it (gateway/gate.py)."""
    before, after = raise_descriptor_limit()
    total, per_client = connection_bounds(settings.max_connections, settings.max_connections_per_client)
    log.info("descriptors: soft limit %d -> %d (the hard limit); the data plane and the gRPC front each hold "
             "up to %d connections (max_connections), %d per client address (max_connections_per_client)",
             before, after, total, per_client)


def _supervise(settings: Settings, data_port: int, control_port: int, grpc_port: int) -> int:
    """Run N workers; forward SIGTERM/SIGINT; restart a worker that dies unexpectedly."""
    metrics_dir = tempfile.mkdtemp(prefix="sgw-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # read by prometheus-client in each worker
    settings = settings.model_copy(update={"prometheus_multiproc_dir": metrics_dir})  # and by our /metrics
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def start(index: int) -> multiprocessing.process.BaseProcess:
        proc = ctx.Process(target=_worker_main, args=(settings, data_port, control_port, index, grpc_port),
                           name=f"sandbox-gateway-worker-{index}")
        proc.start()
        return proc

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in workers:
            if proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    workers = [start(i) for i in range(settings.worker_count)]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from multiprocessing.connection import wait

    while True:
        live = [p for p in workers if p.is_alive()]
        if not live:
            break
        wait([p.sentinel for p in live])
        for index, proc in enumerate(workers):
            if not proc.is_alive() and not stopping and proc.exitcode not in (0, None):
                log.error("worker %d exited with %s; restarting it", index, proc.exitcode)
                workers[index] = start(index)
    with contextlib.suppress(OSError):
        for name in os.listdir(metrics_dir):
            os.unlink(os.path.join(metrics_dir, name))
        os.rmdir(metrics_dir)
    return 0 if all(p.exitcode == 0 for p in workers) else 1

