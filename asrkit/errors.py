"""The one base class of the errors a user can fix: a missing or unreadable file, a bad
config key or value, shards or checkpoints that do not fit, a budget that cannot work.

Library code raises these (each also a ValueError or RuntimeError, whichever its module
raised before); only `asrkit.cli` turns them into one line on stderr and exit code 2.
Anything else that escapes a command is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Raised for input the user can correct; the message names what, where and what to do."""


class InputError(UserError, ValueError):
    """A value or file that cannot be used as given (the general case)."""
