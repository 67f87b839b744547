"""`k3scale dashboard`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("dashboard", help="(issue 8, not built yet)")
    parser.set_defaults(handler=not_built(8, "k3scale dashboard"))
