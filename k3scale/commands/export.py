"""`k3scale export`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("export", help="(issue 7, not built yet)")
    parser.set_defaults(handler=not_built(7, "k3scale export"))
