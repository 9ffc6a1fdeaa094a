"""`comfyveil anon`: install the anon binary, publish ComfyUI as a hidden service.

    comfyveil anon install [--dir DIR]
    comfyveil anon expose --target 127.0.0.1:8188 --client bot [--revoke NAME] [--no-auth]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from pathlib import Path

from comfyveil import cli, config, config_load, config_rules, sdnotify
from comfyveil.anyone import hidden, install, process
from comfyveil.anyone import network as network_mod
from comfyveil.errors import UsageError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("anon", help=cli.SUBCOMMANDS["anon"])
    commands = parser.add_subparsers(dest="anon_command", metavar="ACTION", required=True)

    inst = commands.add_parser("install", help="install the pinned anon binary")
    inst.add_argument("--dir", type=Path, help="install here (default: DATA_DIR/anon)")
    inst.add_argument("--tarball", type=Path,
                      help="use this already downloaded npm tarball instead of npm pack")
    inst.add_argument("--force", action="store_true", help="fetch again even if installed")
    inst.add_argument("--config", type=Path, help="settings file")
    inst.set_defaults(handler=_install)

    exp = commands.add_parser(
        "expose", help="publish a local service (ComfyUI) as a hidden service",
        description="Publish a local service as a persistent hidden service with client "
        "authorization, and keep it online until interrupted.",
    )
    exp.add_argument("--target", required=True, help="local address, e.g. 127.0.0.1:8188")
    exp.add_argument("--name", default="comfyui", help="service name (its directory)")
    exp.add_argument("--port", type=int, default=80, help="port on the hidden address")
    exp.add_argument("--client", action="append", default=[], metavar="NAME",
                     help="authorize a new client and write its key file (repeatable)")
    exp.add_argument("--revoke", action="append", default=[], metavar="NAME",
                     help="remove a client's authorization (repeatable)")
    exp.add_argument("--no-auth", action="store_true",
                     help="anyone who learns the address may connect (not recommended)")
    exp.add_argument("--private-network", type=Path, metavar="FILE",
                     help="join a private test network: a file of DirAuthority lines")
    exp.add_argument("--once", action="store_true",
                     help="exit once the service is published (it goes offline)")
    exp.add_argument("--config", type=Path, help="settings file")
    exp.set_defaults(handler=_expose)


async def _install(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    target = args.dir or install.default_dir(settings)
    result = await install.install(target, tarball=args.tarball, force=args.force)
    state = "installed" if result.downloaded else "already installed"
    print(f"anon {result.version} {state} in {result.directory}")
    return 0


def _target(value: str) -> str:
    """The ComfyUI address a hidden service forwards to: an IP address and a port (anon
    resolves no names there); `localhost` means 127.0.0.1. A target off this machine's
    loopback is allowed (ComfyUI on another host of a private LAN) with a warning: that
    last hop leaves the machine unencrypted.

    Raises:
        UsageError: not IP:PORT with a port from 1 to 65535.
    """
    host, sep, port = value.rpartition(":")
    if host.lower() == "localhost":
        host, value = "127.0.0.1", f"127.0.0.1:{port}"
    problem = config_rules.endpoint_problem(value)
    try:
        address = ipaddress.ip_address(host.strip("[]")) if sep else None
    except ValueError:
        address = None
        problem = problem or "its host is not an IP address (anon resolves no names there)"
    if problem:
        raise UsageError(f"--target must look like 127.0.0.1:8188: {problem} ({value!r})")
    if address is not None and not address.is_loopback:
        print(f"warning: --target {value} is not on this machine's loopback; the hop from "
              "anon to ComfyUI leaves the machine unencrypted", file=sys.stderr)
    return value


async def _expose(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    target = _target(args.target)
    if args.no_auth and args.client:
        raise UsageError("--no-auth and --client contradict each other")
    for name in [*args.client, *args.revoke]:
        if not hidden.CLIENT_NAME.match(name):
            raise UsageError(f"client name {name!r} may only hold letters, digits, '-' and '_'")
    base = settings.data_dir / "anon"
    spec = hidden.HiddenServiceSpec(base / "hs" / args.name, target, args.port)
    await asyncio.to_thread(hidden.prepare_dir, spec.directory)
    for name in args.revoke:
        if hidden.revoke_client(spec.directory, name):
            print(f"revoked client {name}")
        else:
            print(f"client {name} was not authorized")
    existing = hidden.client_names(spec.directory)
    if args.no_auth and existing:
        raise UsageError(
            "clients are authorized (" + ", ".join(existing) + "); revoke them first "
            "with --revoke NAME to drop client authorization"
        )
    if not args.no_auth and not existing and not args.client:
        raise UsageError(
            "client authorization is on by default: name a client with --client NAME "
            "(or pass --no-auth to let anyone with the address connect)"
        )
    new_keys = {name: hidden.add_client(spec.directory, name) for name in args.client}

    network: network_mod.Network = (
        network_mod.PrivateNetwork.from_file(args.private_network)
        if args.private_network else network_mod.PublicNetwork()
    )

    def progress(percent: int, summary: str) -> None:
        print(f"anon: {percent}% {summary}", file=sys.stderr)

    anon = process.ManagedAnon(
        network=network,
        binary=install.find_binary(settings),
        data_dir=base / "service-state" / args.name,
        hidden_services=[spec],
        on_progress=progress,
    )
    async with anon:
        address = anon.address_of(spec)
        service_id, _ = hidden.split_address(address)
        print(f"address: {address}")
        for name, key in new_keys.items():
            key_file = base / "client-keys" / f"{args.name}-{name}.auth_private"
            hidden.write_client_key_file(key_file, service_id, key)
            print(f"client {name}: key file {key_file} (copy it to the bot host, mode 0600)")
        print("on the bot host:\n  [[backends]]\n"
              f'  url = "http://{address}{"" if args.port == 80 else f":{args.port}"}"\n'
              '  auth_key_file = "/path/to/that/key file"')
        await anon.wait_published(service_id)
        print("published; press Ctrl-C to stop" if not args.once else "published")
        sys.stdout.flush()
        sdnotify.notify("READY=1\nSTATUS=published")  # comfyveil-expose@.service
        if not args.once:
            await asyncio.Event().wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m comfyveil.cli.anon install ...`: these commands without the others."""
    from comfyveil import cli

    parser = argparse.ArgumentParser(prog="comfyveil")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["anon", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(asyncio.run(args.handler(args)) or 0)
    except KeyboardInterrupt:
        return 130
    except (UsageError, config.ConfigError) as exc:
        print(f"comfyveil: {exc}", file=sys.stderr)
        return cli.EXIT_USAGE
    except cli.ComfyveilError as exc:
        print(f"comfyveil: {exc}", file=sys.stderr)
        return cli.EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
