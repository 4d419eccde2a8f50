"""Errors a user can fix. The CLI prints their message alone and exits non-zero."""


class UserError(Exception):
    """Bad input: the message names the thing and the fix."""


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, a broken env); the last good checkpoint is kept."""
