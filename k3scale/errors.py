"""The one exception type users see: its message is printed as a single line by the CLI."""


class K3ScaleError(Exception):
    """A problem the user can fix (bad input, missing data, unreachable server).

    The message names the step that failed and how to fix it; the CLI prints it as one line and
    exits non-zero. Internal bugs raise anything else.
    """


class TrackingUnreachableError(K3ScaleError):
    """The tracking server did not answer before a run started: nothing was trained or logged,
    so a study driver may relaunch the run once the server is back."""


class TrackingOutageError(K3ScaleError):
    """The tracking server stopped answering part-way through a call that is safe to repeat
    (a replica replay): the caller may wait for the server and call again."""


class ConfigError(K3ScaleError, ValueError):
    """A config value or override that does not fit the dataclass; the message names the key."""
