"""The root exception and the contract-level errors every stage shares."""


class VigilError(Exception):
    """Root of every error Vigil raises on purpose: ``str(error)`` names the problem in
    one line, ``fix`` (when known) says in one line what to do about it. The command line
    prints both on one line and exits non-zero; a traceback is for bugs alone."""

    fix: str = ""

    def __init__(self, *args: object, fix: str = "") -> None:
        super().__init__(*args)
        if fix:
            self.fix = fix


class ContractError(VigilError):
    """A message does not satisfy the wire contract.

    ``reason`` is a short machine-friendly code (used as a dead-letter label and a
    metric label); ``str(error)`` is the human sentence with the offending path.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ConfigError(VigilError):
    """The configuration file or a VIGIL_* variable is invalid."""
