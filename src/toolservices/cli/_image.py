"""``toolservices image pull|ls|rm|prune``: the layer cache from the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

__all__ = ["add_image_parser", "run_image"]


def add_image_parser(commands: Any) -> None:
    image = commands.add_parser("image", help="pull, list and remove images in the layer cache")
    image.add_argument(
        "--cache",
        help="cache directory (default: $TOOLSERVICES_IMAGE_CACHE or ~/.cache/toolservices/images)",
    )
    image.add_argument("--max-bytes", type=int, help="the cache's size budget in bytes")
    actions = image.add_subparsers(dest="action", required=True, metavar="ACTION")
    pull = actions.add_parser(
        "pull",
        help="pull a reference (oci:, oci-archive:, docker-archive:, docker://) into the cache",
    )
    pull.add_argument("reference")
    pull.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a registry reached over plain HTTP (repeatable)",
    )
    pull.add_argument("--auth-file", help="credentials file (default: podman's and docker's)")
    actions.add_parser("ls", help="list the cached images")
    rm = actions.add_parser("rm", help="remove an image (by name or digest) and unused layers")
    rm.add_argument("name")
    actions.add_parser("prune", help="remove layers no image uses and leftovers of failed pulls")


def run_image(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from toolservices.images import DEFAULT_MAX_BYTES, ImageError, ImageStore

    out = out or sys.stdout  # looked up at the call: a default would keep an old one

    store = ImageStore(args.cache, max_bytes=args.max_bytes or DEFAULT_MAX_BYTES)
    try:
        if args.action == "pull":
            image = store.pull(
                args.reference, insecure_registries=args.insecure_registry, auth_file=args.auth_file
            )
            print(f"{image.digest}  {_mib(image.size)}  {len(image.layers)} layers", file=out)
        elif args.action == "ls":
            print(f"{'DIGEST':<20} {'SIZE':>10} {'LAYERS':>6}  NAMES", file=out)
            for record in store.records():
                names = ", ".join(record["names"])
                print(
                    f"{record['digest'][7:19]:<20} {_mib(record['size']):>10} "
                    f"{len(record['layers']):>6}  {names}",
                    file=out,
                )
            print(
                f"cache {store.root}: {_mib(store.used_bytes())} of {_mib(store.max_bytes)}",
                file=out,
            )
        elif args.action == "rm":
            image = store.remove(args.name)
            print(f"removed {image.digest}", file=out)
        else:
            print(f"freed {_mib(store.prune())}", file=out)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
