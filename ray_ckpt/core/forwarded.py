"""``Forwarded``: a read-only attribute that reads the same-named attribute of another one."""

from __future__ import annotations

from typing import Generic, Never, TypeVar, overload

T = TypeVar("T")


class Forwarded(Generic[T]):
    """In a class body, ``job = Forwarded[str]("identity")`` makes ``obj.job`` read
    ``obj.identity.job``: the attribute's own name, looked up on the attribute named ``via``
    at every read (so it follows a replaced ``identity``). Read-only, as a property without a
    setter: assigning it raises ``AttributeError``."""

    def __init__(self, via: str) -> None:
        self.via = via
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forwarded[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Forwarded[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self.via), self.name)
        return value

    def __set__(self, obj: object, value: Never) -> None:
        raise AttributeError(f"{self.name} is read-only: it is {self.via}.{self.name}")
