"""`k3scale bench`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("bench", help="(issue 3, not built yet)")
    parser.set_defaults(handler=not_built(3, "k3scale bench"))
