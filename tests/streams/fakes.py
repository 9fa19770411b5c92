"""What Faust hands the worker's processors, without Kafka: a delivered event and its
message, and a checkpoint table kept in a dict (the tests' outlets subclass it)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass
class FakeMessage:
    """The fields of Faust's ``Message`` the processors read."""

    key: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    headers: Any = ()


@dataclass
class FakeDelivered:
    """A Faust ``EventT``: the value and its message."""

    value: bytes
    message: FakeMessage


class DictTable(MutableMapping[bytes, Any]):
    """A checkpoint table in a dict; ``_written`` sees every write."""

    def __init__(self) -> None:
        self.store: dict[bytes, Any] = {}

    def _written(self, key: bytes) -> None:
        """Called before a checkpoint is stored (a journal logs it)."""

    def __getitem__(self, key: bytes) -> Any:
        return self.store[key]

    def __setitem__(self, key: bytes, value: Any) -> None:
        self._written(key)
        self.store[key] = value

    def __delitem__(self, key: bytes) -> None:
        del self.store[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)
