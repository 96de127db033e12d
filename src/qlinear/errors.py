"""Exceptions that several layers raise (operators and kernels alike)."""


class AccumulatorOverflowError(ValueError, OverflowError):
    """The exact integer accumulator leaves int32, the specs' accumulator type (never wrapped silently).

    Both a ValueError (the inputs are outside what the operator can represent) and an OverflowError.
    ``value`` is the offending exact sum (the extreme that leaves int32), when known.
    """

    def __init__(self, message: str, value: int | None = None):
        super().__init__(message)
        self.value = value
