"""The one exception type that user-facing code turns into a one-line error and exit code 2."""


class InputError(Exception):
    """Bad user input (scenario, trace, profile, CLI value).

    The message is a single line that names the field or file and says what is allowed;
    the CLI prints it without a traceback and exits with status 2.
    """
