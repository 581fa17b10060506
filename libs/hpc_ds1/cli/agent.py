"""`hpc-ds1 agent --server URL --token JOIN_TOKEN [--ca-cert-hash sha256:…]`: make this machine a
device of a coordinator's fleet (see hpc_ds1.fleet.agent); the join command `serve` prints has
all three. Run `hpc-ds1 setup` in this home first, so the coordinator
knows what this device measured; the agent uploads it. Ctrl+C stops it (a running task is
killed)."""

from __future__ import annotations

import argparse
import sys

from ..requests import SAFE_ID_RULE
from ..security.credentials import CredentialError
from . import UsageError
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "agent", help="serve as a device of a coordinator's fleet (polls it over HTTP)"
    )
    parser.add_argument(
        "--server", required=True, help="the coordinator, https://HOST:PORT (http on a trusted net)"
    )
    parser.add_argument(
        "--ca-cert-hash",
        metavar="sha256:HEX",
        help="the coordinator's CA pin, as the join command carries it (kubeadm's "
        "--discovery-token-ca-cert-hash): a server whose chain does not end at that CA is "
        "refused. Kept with the credential; without it an https server must satisfy the "
        "system trust store (a site certificate)",
    )
    parser.add_argument(
        "--token",
        help="the coordinator's join token (`hpc-ds1 token join` there); not needed once this "
        "home has joined (credentials/device.json)",
    )
    parser.add_argument("--name", help=f"the device's name when it joins: {SAFE_ID_RULE}")
    parser.add_argument(
        "--slurm-partition",
        metavar="P",
        help="serve Slurm partition P as the device, from a login node: each task goes through "
        "`sbatch --wait` to a node of P and the fingerprint is a node's (this home must be "
        "visible from the nodes)",
    )
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..fleet.agent import Agent
    from ..fleet.client import FleetError
    from ..fleet.slurm import SlurmError

    settings = load_settings(home=args.home)
    try:
        agent = Agent(
            args.server,
            args.token,
            home=settings.home,
            name=args.name,
            slurm_partition=args.slurm_partition,
            ca_pin=args.ca_cert_hash,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    agent.settings = settings

    def ready(device_id: str) -> None:
        print(f"device {device_id}", flush=True)
        if agent.identity is not None and agent.identity.ca_pin:
            print(f"trusting the coordinator's CA {agent.identity.ca_pin}", flush=True)
        print(f"polling {agent.server} (Ctrl+C stops)", flush=True)

    agent.on_ready = ready
    try:
        agent.run()
    except (FleetError, CredentialError, SlurmError) as error:
        print(f"hpc-ds1 agent: {error}", file=sys.stderr)
        return 1
    return 0
