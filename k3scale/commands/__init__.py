"""One module per `k3scale` command group; each exposes `register(subparsers)`."""


def not_built(issue: int, what: str):
    """Handler for a command whose issue has not landed: a clear error, never a fake result."""
    from k3scale.errors import K3ScaleError

    def handler(args) -> int:
        raise K3ScaleError(f"{what} is not built yet (tracked in issue {issue})")

    return handler
