"""`k3scale study`."""

from k3scale.commands import not_built


def register(sub) -> None:
    parser = sub.add_parser("study", help="(issue 6, not built yet)")
    parser.set_defaults(handler=not_built(6, "k3scale study"))
