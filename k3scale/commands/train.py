"""`k3scale train`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("train", help="(issue 5, not built yet)")
    parser.set_defaults(handler=not_built(5, "k3scale train"))
