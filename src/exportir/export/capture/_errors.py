"""The error capture raises for a program that cannot be exported as written."""


class ExportError(RuntimeError):
    """The program cannot be exported as written; the message says where and what to do."""
