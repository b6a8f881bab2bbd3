"""A vLLM server on its own machine: one node serves, the others train and reach it over the network.

- Serving (`trl-ext launch --serve-only`): the plan's server alone, listening on this machine's address (the one its
  name resolves to, or `--bind`), until it is stopped. Only training rank 0 talks to it, but anyone who reaches the
  address can replace its weights (`trl vllm-serve` opens its weight-update endpoints), so it belongs on a
  cluster's internal network.
- Training (`vllm_server_host` names another machine): the plan names the server's host, its address and the URL the
  trainer uses, and refuses a host this machine cannot resolve or has no route to before anything starts; the
  launch then waits for the server's `/health` (it may still be loading) before it starts the trainer, and refuses
  one that does not answer in time.

Name resolution and a route lookup only (a UDP socket connected without sending anything): no traffic before the
health check.
"""

from __future__ import annotations

import socket

from trl_ext.launch.configs import LaunchError
from trl_ext.launch.planning import HEALTH_PATH, url_host


def resolve(host: str, what: str) -> str:
    """`host`'s address as this machine resolves it (the first IPv4 one, else IPv6).

    Raises:
        LaunchError: the name does not resolve here (`what` says where it came from).
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise LaunchError(f"{what} {host!r} does not resolve from this machine ({exc})") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][4][0]


def check_route(address: str, host: str, what: str) -> None:
    """Raises LaunchError when this machine has no route to `address` (a UDP connect: the kernel picks the route,
    nothing is sent)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError as exc:
            raise LaunchError(f"{what} {host} ({address}) is not reachable from this machine: {exc}") from None


def remote_server(host: str, port: int, base_url: str | None, what: str = "vllm_server_host") -> tuple[str, str]:
    """The health URL of a server on another machine and the plan's note naming it; refuses one this machine
    cannot resolve or route to (`resolve`, `check_route`)."""
    address = resolve(host, what)
    check_route(address, host, what)
    url = (base_url.rstrip("/") if base_url else f"http://{url_host(host)}:{port}") + HEALTH_PATH
    note = (
        f"the vLLM server runs on {host} ({address}), not here: the trainer reaches it at "
        f"{url.removesuffix(HEALTH_PATH)} and starts once {url} answers (`trl-ext launch --serve-only` with this "
        "recipe starts it there)"
    )
    return url, note


def this_machine_address() -> str:
    """The address this machine's name resolves to (where a cluster's other nodes reach it)."""
    name = socket.gethostname()
    return resolve(name, "this machine's name")


def serve_note(bind: str, port: int) -> str:
    return (
        f"--serve-only: the vLLM server alone, listening on {bind}:{port} for the machines that train (point their "
        f"vllm_server_host here); whoever reaches that address can replace its weights: keep it on the cluster's "
        "internal network"
    )
