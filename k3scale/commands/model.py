"""`k3scale model`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("model", help="(issue 3, not built yet)")
    parser.set_defaults(handler=not_built(3, "k3scale model"))
