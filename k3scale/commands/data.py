"""`k3scale data`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("data", help="(issue 2, not built yet)")
    parser.set_defaults(handler=not_built(2, "k3scale data"))
